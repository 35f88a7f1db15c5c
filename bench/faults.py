"""Ranks killed with SIGKILL at chosen moments, on the built-in loop and on a run.elastic()
script: how long the others take to form the smaller world, how long a killed rank takes to
join again once its standby is warm (and from its join order; a script's from when it said it
is prepared, its own set-up done), and how long rank 0 stood still for each join. One run
each, driven as the s/r/k keys drive it.

python bench/faults.py builtin --gpus 0,1 --cycles 10   # resnet18, synthetic data
python bench/faults.py script --gpus 0,1 --cycles 10    # examples/elastic_ddp.py
Each cycle: rank 1 joins again (r) and is killed at the cycle's moment, in turn: while it joins
(0, 0.15 or 0.3 s after its join was ordered; a script's: after it said it is prepared) or 0,
0.2, 0.5, 1 or 2 s after the world of 2 formed, or it is stopped (s) 1 s after the world of 2
formed; a row per cycle, then a Markdown summary. A cycle that does not recover within 60 s
ends the bench with a non-zero exit; one slower than --stacks-after (8 s) prints every rank's
stacks. The run's log: $OUT/faults-KIND.jsonl.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time

from ddptui.contract.options.devices import resolve_devices
from ddptui.contract.protocol.codec import event_of, parse

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOMENTS = (("join", 0.0), ("world", 0.0), ("join", 0.15), ("world", 0.2), ("join", 0.3),
           ("world", 0.5), ("world", 1.0), ("world", 2.0), ("stop", 1.0))


def start(kind: str, gpus: str, log: str, extra: list[str]):
    where = ["--gpus", gpus] if gpus != "cpu" else ["--cpus", "2"]
    if kind == "builtin":
        from ddptui.contract.options.parser import Parser
        from ddptui.contract.options.training import add_training_options, config_from_args
        from ddptui.run.builtin.supervisor import Supervisor

        parser = Parser()
        add_training_options(parser)
        args = parser.parse_args(["resnet18", "--data", "synthetic", "--amp", "bf16",
                                  "--channels-last", "--batch-size", "256", "--epochs", "1000"]
                                 if gpus != "cpu" else ["resnet18", "--data", "synthetic",
                                                        "--image-size", "32", "--epochs", "1000"])
        devices = resolve_devices(gpus, None) if gpus != "cpu" else resolve_devices(None, 2)
        return Supervisor(config_from_args(args, gpus=devices[0], cpus=devices[1]), log)
    import dataclasses

    from ddptui.contract.options.script import parse_script_args
    from ddptui.run.script.run import ScriptRun

    config = parse_script_args([os.path.join(ROOT, "examples", "elastic_ddp.py"), *where,
                                "--log", log, "--", "--epochs", "300", "--samples",
                                "40000", "--batch-size", "64", "--image-size", "64",
                                "--workers", "2", *extra], resolve_devices)
    return ScriptRun(dataclasses.replace(config, headless=True))


class Log:
    """The run's event log, read on from where the last look stopped: parsing it whole every
    20 ms took the GIL from the run in this same process and delayed each kill by seconds."""

    def __init__(self, path: str):
        self.path, self.events, self._at = path, [], 0

    def read(self) -> list[dict]:
        if os.path.exists(self.path):
            with open(self.path, encoding="utf-8", errors="replace") as f:
                f.seek(self._at)
                chunk = f.read()
            whole = chunk[:chunk.rfind("\n") + 1]
            self._at += len(whole.encode())
            self.events += [e for e in map(parse, whole.splitlines())
                        if e is not None and event_of(e) is not None]
        return self.events


def worlds(log: Log) -> list[dict]:
    return [e for e in log.read() if e["kind"] == "world" and e["rank"] >= 0]


def wait(run, predicate, what: str, timeout: float = 60.0, slow: float = float("inf")) -> float:
    """Until predicate(); where every rank is, once, when it takes longer than `slow` s."""
    t0, told = time.monotonic(), False
    while not predicate():
        if time.monotonic() - t0 > timeout or run.done.is_set():
            print_stacks(run)
            raise SystemExit(f"faults bench: {what} not seen within {timeout:.0f} s")
        if not told and time.monotonic() - t0 > slow:
            print(f"{what}: not seen after {slow:.0f} s; the ranks' stacks:", flush=True)
            print_stacks(run)
            told = True
        time.sleep(0.02)
    return time.monotonic() - t0


def print_stacks(run) -> None:
    """Where every live rank is, for a cycle that did not recover."""
    if hasattr(run, "slots"):
        ranks = [(r.process.pid, r.stacks_path, signal.SIGUSR1) for r in run.pool.procs if r.alive]
    else:
        ranks = [(r.pid, r.stacks_path, run.config.stacks_signal) for r in run.group.alive()]
    for pid, _path, sig in ranks:
        try:
            os.kill(pid, sig)
        except OSError:
            pass
    time.sleep(2)
    for pid, path, _ in ranks:
        text = open(path).read() if os.path.exists(path) else "(no stacks)"
        print(f"== {pid} {path}\n{text[-2500:]}", flush=True)
        print(threads_and_sockets(pid), flush=True)


def threads_and_sockets(pid: int) -> str:
    """Each thread's name and kernel wait, and the process's sockets with their TCP state:
    where native code (NCCL's set-up) waits, which Python's stacks do not show."""
    lines = []
    for tid in sorted(os.listdir(f"/proc/{pid}/task"), key=int):
        task = f"/proc/{pid}/task/{tid}"
        lines.append(f"  thread {tid} {_read(task + '/comm')!r} wchan={_read(task + '/wchan')} "
                     f"syscall={_read(task + '/syscall').split(' ')[0]}")
    states = {}  # socket inode -> its TCP row (addresses in hex, st=0A listening)
    for table in ("tcp", "tcp6"):
        for row in _read(f"/proc/{pid}/net/{table}").splitlines()[1:]:
            f = row.split()
            states[f[9]] = f"{table} {f[1]} -> {f[2]} st={f[3]}"
    for fd in sorted(os.listdir(f"/proc/{pid}/fd"), key=int):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:"):
            lines.append(f"  fd {fd} {states.get(target[8:-1], 'unix/other')}")
    return "\n".join(lines)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "?"


def pid_of(run, slot: int) -> int:
    if hasattr(run, "slots"):
        return run.slots[slot].process.pid
    return [r for r in run.group.alive() if r.slot == slot][-1].pid  # the newest: no standby then


def ready_t(log: Log, slot: int, after: float) -> float | None:
    """When the slot's standby said it was warm, after `after`."""
    return next((e["t"] for e in log.read() if e["kind"] == "rank" and e["rank"] == slot
                 and e.get("standby") == "ready" and e["t"] > after), None)


def joining_t(log: Log, slot: int, after: float, kind: str) -> float | None:
    """When the world began to form with the slot, after `after`: the built-in loop's joiner
    was told to join (it is restarting), a script's joiner said it is prepared (the members are
    told then; a kill while its script prepares costs them nothing: tests/script)."""
    return next((e["t"] for e in log.read() if e["kind"] == "rank" and e["rank"] == slot
                 and e.get("state") == "restarting" and e["t"] > after
                 and (kind == "builtin" or e.get("standby") == "prepared")), None)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("kind", choices=("builtin", "script"))
    p.add_argument("--gpus", default="0,1", help="GPU indices, or cpu (2 CPU ranks, to try it)")
    p.add_argument("--cycles", type=int, default=10)
    p.add_argument("--moments", default=None, help="the cycles' moments in turn, e.g. "
                   "join:0.3,world:0 (default: all of them)")
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "."), "faults.json"))
    p.add_argument("--script-args", default="", help="more arguments for the script, e.g. "
                   "--device-id (its NCCL communicator made in init_process_group)")
    p.add_argument("--stacks-after", type=float, default=8.0, help="a recovery slower than "
                   "this many seconds prints every rank's stacks")
    args = p.parse_args()
    moments = MOMENTS if args.moments is None else [
        (m.split(":")[0], float(m.split(":")[1])) for m in args.moments.split(",")]
    path = os.path.join(os.environ.get("OUT", "/tmp"), f"faults-{args.kind}.jsonl")
    if os.path.exists(path):
        os.remove(path)
    run = start(args.kind, args.gpus, path, args.script_args.split())
    log = Log(path)
    run.start()
    wait(run, lambda: any(e["kind"] == "step" for e in log.read()), "the first step", 300)
    time.sleep(5)
    rows = []
    killed = time.time()
    os.kill(pid_of(run, 1), signal.SIGKILL)  # the first kill: mid-step
    wait(run, lambda: len(worlds(log)) >= 1, "the world of 1")
    for cycle in range(args.cycles):
        after, delay = moments[cycle % len(moments)]
        seen, asked = len(worlds(log)), time.time()
        run.restart_rank(1)  # it joins as soon as its standby is warm
        if after == "join":
            wait(run, lambda asked=asked: joining_t(log, 1, asked, args.kind), "the join ordered",
                 180)
            formed = None
        else:
            wait(run, lambda seen=seen: any(w["size"] == 2 for w in worlds(log)[seen:]),
                 "the world of 2", 180)
            formed = [w for w in worlds(log)[seen:] if w["size"] == 2][0]["t"]
        time.sleep(delay)
        seen = len(worlds(log))
        warm = ready_t(log, 1, killed) or asked  # the standby started at the last kill
        killed = time.time()
        if after == "stop":
            run.stop_rank(1)
        else:
            os.kill(pid_of(run, 1), signal.SIGKILL)
        wait(run, lambda seen=seen: any(w["size"] == 1 for w in worlds(log)[seen:]),
             "the world of 1 again", slow=args.stacks_after)
        smaller = [w for w in worlds(log)[seen:] if w["size"] == 1][0]["t"]
        rows.append({"cycle": cycle, "moment": f"{after}+{delay}",
                     "after_world_s": None if formed is None else round(killed - formed, 2),
                     "join_s": None if formed is None else round(formed - max(warm, asked), 2),
                     # a script's from its "prepared" (its own set-up done), the loop's from
                     # the join order
                     "joined_s": None if formed is None else round(
                         formed - (joining_t(log, 1, asked, args.kind) or formed), 2),
                     "recover_s": round(smaller - killed, 2), "formed": formed})
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "formed"}), flush=True)
    run.stop()
    code = run.wait(60)
    for row in rows:  # read once the run is over: the steps after each world are all logged
        formed = row.pop("formed")
        row["paused_s"] = None if formed is None else paused_s(log, formed)
    print("rank 0 paused by each join (s):", [r["paused_s"] for r in rows])
    with open(args.out, "a") as f:
        f.write(json.dumps({"kind": args.kind, "gpus": args.gpus, "rows": rows,
                            "exit": code}) + "\n")
    join = [r["join_s"] for r in rows if r["join_s"] is not None]
    joined = [r["joined_s"] for r in rows if r["joined_s"] is not None]
    paused = [r["paused_s"] for r in rows if r["paused_s"] is not None]
    kills = [r["recover_s"] for r in rows if not r["moment"].startswith("stop")]
    print("\n| run | kills survived | rejoins | join: median, max (s) | from the join order or "
          "prepared (s) | rank 0 paused by a join: median, max (s) | recovery after a kill: "
          "median, max (s) |\n|---|---|---|---|---|---|---|")
    print(f"| {args.kind} | {len(kills) + 1} of {len(kills) + 1} | {len(rows)} | "
          f"{spread(join)} | {spread(joined)} | {spread(paused)} | {spread(kills)} |")
    print(f"exit {code}")
    return 0


def paused_s(log: Log, formed: float) -> float | None:
    """How long rank 0 stood still for a join: its step events' gap around the world of 2
    forming (it reports about 20 times a second while it trains)."""
    steps = [e["t"] for e in log.read() if e["kind"] == "step" and e["rank"] == 0]
    before = [t for t in steps if t <= formed]
    after = [t for t in steps if t >= formed]
    return round(min(after) - max(before), 2) if before and after else None


def spread(seconds: list[float]) -> str:
    """'median, max' of some seconds; '-' for none (every kill came before its world formed)."""
    return f"{statistics.median(seconds):.2f}, {max(seconds):.2f}" if seconds else "-"


if __name__ == "__main__":
    sys.exit(main())
