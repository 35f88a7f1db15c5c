"""What the step clock costs, and whether its phases add up, on the GPUs: the built-in loop and
a torchrun script (bench/plain_ddp.py under `ddptui run`, no code change) with the clock on
against DDPTUI_STEP_CLOCK=0, alternating, in one call; `--sanitizer`: both once more under
PyTorch's CUDA sanitizer (its events and comm hook on the autograd thread); `--named`: a phase
made slow on purpose from the second epoch on (bench/slow_phase.py: a sleep in forward, a slow
dataset), and what the run's verdict says of it.

python bench/phases.py --gpus 1 --rounds 2 --steps 300 [--without-hook] [--sanitizer] [--named]
Prints a Markdown table: img/s on and off per round and the ratio of their medians, for each
leg; how far each rank's windows (after its first) are from the wall time they cover; the
sanitizer runs' exit codes and any race they reported; the named runs' findings.
(`--legs --named --cpu`: the named runs alone on CPU ranks, to try them without a GPU.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(ROOT, "bench", "plain_ddp.py")
SLOW = os.path.join(ROOT, "bench", "slow_phase.py")
# What the verdict must say of each phase made slow: the phase, by name.
NAMED = {"forward": "forward", "data": "data-wait"}


def run(leg: str, on: bool, gpus: int, steps: int, warmup: int, env_extra: dict) -> dict:
    """One run of `leg` (builtin | script): its img/s over the steady window, and its phases."""
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "run.jsonl")
        devices = ",".join(map(str, range(gpus)))
        if leg == "builtin":
            cmd = ["run", "resnet18", "--gpus", devices, "--data", "synthetic", "--amp", "bf16",
                   "--channels-last", "--batch-size", "256", "--epochs", "1",
                   "--steps-per-epoch", str(warmup + steps)]
        else:
            cmd = ["run", SCRIPT, "--gpus", devices, "--", "--model", "resnet18", "--steps",
                   str(steps), "--warmup", str(warmup)]
        env = dict(os.environ, DDPTUI_STEP_CLOCK="1" if on else "0", **env_extra)
        out = subprocess.run([sys.executable, "-m", "ddptui", *cmd[:1], "--headless", "--log",
                              log, *cmd[1:]], capture_output=True, text=True, cwd=tmp, env=env)
        evs = [json.loads(line) for line in open(log)] if os.path.exists(log) else []
    result = {"exit": out.returncode, "csan": "CSAN" in out.stderr or "data race" in out.stderr,
              "tail": out.stderr[-1500:] if out.returncode else ""}
    if out.returncode:
        return result
    if leg == "script":
        result["img_s"] = json.loads([ln for ln in out.stdout.splitlines()
                                      if ln.startswith("{")][-1])["img_s"]
    else:
        window = [e for e in evs if e["kind"] == "step" and e["rank"] == 0
                  and e["global_step"] >= warmup]
        a, b = window[0], window[-1]
        result["img_s"] = (b["global_step"] - a["global_step"]) * 256 * gpus / (b["t"] - a["t"])
    result["adds_up"] = adds_up([e for e in evs if e["kind"] == "phases"])
    result["shares"] = shares([e for e in evs if e["kind"] == "phases"])
    return result


def named(slow: str, gpus: int, cpu: bool) -> dict:
    """A run of bench/slow_phase.py slowed in `slow` from its second epoch: its verdict's
    findings (`ddptui report --json`), and whether one names the phase."""
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, f"{slow}.jsonl")
        devices = ["--cpus", str(gpus)] if cpu else ["--gpus", ",".join(map(str, range(gpus)))]
        size = ["--image-size", "32", "--batch-size", "32"] if cpu else []
        out = subprocess.run([sys.executable, "-m", "ddptui", "run", "--headless", "--log", log,
                              *devices, SLOW, "--", "--slow", slow, *size],
                             capture_output=True, text=True, cwd=tmp)
        report = subprocess.run([sys.executable, "-m", "ddptui", "report", log, "--json"],
                                capture_output=True, text=True, cwd=tmp)
    if out.returncode or report.returncode:
        return {"exit": out.returncode or report.returncode,
                "tail": (out.stderr + report.stderr)[-1500:]}
    got = json.loads(report.stdout)
    return {"exit": 0, "findings": got["findings"], "phases": got["phases"],
            "named": any(NAMED[slow] in f for f in got["findings"])}


def adds_up(windows: list[dict]) -> float | None:
    """The largest gap, over the ranks and epochs, between the steps their steady windows add
    up to and the wall time between the windows' events (a fraction of that time). Steady: not
    the first (its steps began with the clock) nor the last, sent at the epoch's end or at exit,
    after time that is no step's (a script's destroy_process_group, the loop's validation)."""
    worst = None
    for key in {(w["rank"], w.get("epoch")) for w in windows}:
        span = [w for w in windows if (w["rank"], w.get("epoch")) == key][:-1]
        if len(span) < 3:
            continue
        stepped = sum(w["steps"] * w["step_ms"] for w in span[1:]) / 1000
        wall = span[-1]["t"] - span[0]["t"]
        gap = abs(stepped - wall) / wall
        worst = gap if worst is None else max(worst, gap)
    return worst


def shares(windows: list[dict]) -> dict:
    total = sum(w["steps"] * w["step_ms"] for w in windows)
    return {p: round(sum(w["steps"] * w["phases"][p][0] for w in windows) / total, 4)
            for p in (windows[0]["phases"] if windows else {})} if total else {}


def _rates(runs: list[dict]) -> str:
    return ", ".join(f"{r['img_s']:,.0f}" for r in runs)


# Each variant: the clock on, and ddptui's environment beside it.
VARIANTS = {"on": (True, {}), "off": (False, {}),
            "on, DDP's own reduction": (True, {"DDPTUI_COMM_HOOK": "0"})}


def measure(leg: str, args) -> dict:
    """`leg`'s variants in turn, a round at a time, each round starting one further along (so
    none always goes first); the ratio of each variant's median to off's."""
    names = list(VARIANTS)[:3 if args.without_hook else 2]
    runs: dict[str, list[dict]] = {n: [] for n in names}
    for i in range(args.rounds):
        for name in names[i % len(names):] + names[:i % len(names)]:
            clock, env = VARIANTS[name]
            r = run(leg, clock, args.gpus, args.steps, args.warmup, env)
            if r["exit"]:
                raise SystemExit(f"{leg} ({name}) failed:\n{r['tail']}")
            runs[name].append(r)
    off = statistics.median(r["img_s"] for r in runs["off"])
    ratios = {n: statistics.median(r["img_s"] for r in runs[n]) / off for n in names}
    gaps = [r["adds_up"] for r in runs["on"] if r["adds_up"] is not None]
    worst = max(gaps, default=None)
    gap = "-" if worst is None else f"{worst:.2%} (each run: {', '.join(f'{g:.2%}' for g in gaps)})"
    beside = "".join(f"; {n}: {_rates(runs[n])} ({ratios[n]:.4f})" for n in names[2:])
    print(f"| {leg} | {_rates(runs['on'])} | {_rates(runs['off'])} | {ratios['on']:.4f}{beside} "
          f"| {gap} | {runs['on'][0]['shares']} |", flush=True)
    return {"runs": runs, "ratios": ratios, "adds_up": worst}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--legs", nargs="*", default=["builtin", "script"])
    ap.add_argument("--without-hook", action="store_true",
                    help="a third variant: the clock on, DDP's own reduction kept "
                    "(DDPTUI_COMM_HOOK=0): what ddptui's comm hook costs")
    ap.add_argument("--sanitizer", action="store_true")
    ap.add_argument("--named", action="store_true")
    ap.add_argument("--cpu", action="store_true", help="--named on CPU ranks")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    print("| leg | img/s on, per round | img/s off, per round | on / off (medians) | "
          "phases vs wall, worst | shares (on) |")
    print("|---|---|---|---|---|---|")
    # --rounds 0: the sanitizer or the named runs alone
    rows = {leg: measure(leg, args) for leg in (args.legs if args.rounds else ())}
    if args.sanitizer:
        for leg in args.legs:
            r = run(leg, True, args.gpus, 40, 10, {"TORCH_CUDA_SANITIZER": "1"})
            rows[f"{leg}-sanitizer"] = r
            print(f"sanitizer, {leg}: exit {r['exit']}, race reported: {r['csan']}"
                  + (f"\n{r['tail']}" if r["exit"] else ""), flush=True)
    if args.named:
        for slow in NAMED:
            r = named(slow, args.gpus, args.cpu)
            rows[f"named-{slow}"] = r
            print(f"{slow} made slow: exit {r['exit']}, named: {r.get('named')}; "
                  f"{r.get('findings') or r.get('tail')}; shares {r.get('phases')}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
