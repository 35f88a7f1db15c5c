"""What one run really runs on the host while it trains: per role (ddptui, the fork server, each
rank, its loader workers) the processes, threads and cores busy, the busiest threads, the host's
CPU, and NVIDIA's JPEG engines (nvidia-smi dmon's jpg) over the same window as img/s.

python bench/threads.py /data/jpeg --gpus 0 --seconds 15 -- --decode gpu
python bench/threads.py /data/jpeg --gpus 0 --env OMP_NUM_THREADS=1 -- --decode gpu --workers 4
Prints one JSON line. The window starts once rank 0 is past --warmup steps. --profile FILE: rank
0's Python stacks over the window too, every thread's, idle ones included (py-spy record --idle
--threads --nonblocking, collapsed: one stack and its sample count a line).
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time

import psutil

TICK = os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("root")
    ap.add_argument("--gpus", default="0")
    ap.add_argument("--warmup", type=int, default=60)
    ap.add_argument("--seconds", type=float, default=15.0)
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--model", default="resnet18")
    ap.add_argument("--env", action="append", default=[], help="NAME=VALUE for the run")
    ap.add_argument("--profile", default=None, metavar="FILE", help="py-spy's record of rank 0")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    args, extra = ap.parse_args(argv[:cut]), argv[cut + 1:]
    env = dict(os.environ, **dict(kv.split("=", 1) for kv in args.env))
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "run.jsonl")
        run = subprocess.Popen(
            [sys.executable, "-m", "ddptui", "run", args.model, "--headless", "--gpus", args.gpus,
             "--data", f"imagefolder:{args.root}", "--amp", "bf16", "--channels-last",
             "--batch-size", str(args.batch_size), "--epochs", "50", "--log", log, *extra],
            cwd=tmp, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            while _last_step(log) < args.warmup:
                if run.poll() is not None:
                    sys.exit(f"the run ended ({run.returncode}) before step {args.warmup}")
                time.sleep(0.5)
            figures = window(run.pid, log, args.seconds, args.batch_size, args.profile)
        finally:
            run.terminate()
            run.wait(timeout=60)
    print(json.dumps({"options": " ".join(args.env + extra), **figures}), flush=True)


def window(parent: int, log: str, seconds: float, batch: int, profile: str | None) -> dict:
    """Threads' CPU over `seconds`, and the run's img/s and data-wait over the same span."""
    roles = _roles(parent, log)
    spy = None
    if profile:
        rank0 = next(pid for pid, role in roles.items() if role == "rank 0")
        spy = subprocess.Popen(["py-spy", "record", "--pid", str(rank0), "--duration",
                                str(int(seconds)), "--idle", "--threads", "--nonblocking",
                                "--format", "raw", "--output", profile],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    dmon = subprocess.Popen(["nvidia-smi", "dmon", "-s", "u", "-c", str(int(seconds))],
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    psutil.cpu_percent()
    before, t0, s0 = _ticks(roles), time.time(), _steps(log)
    time.sleep(seconds)
    after, t1, s1 = _ticks(roles), time.time(), _steps(log)
    host = psutil.cpu_percent() / 100 * (psutil.cpu_count() or 1)
    out = dmon.communicate(timeout=30)[0]
    if spy is not None:
        spy.wait(timeout=60)
    busy: dict[str, float] = collections.defaultdict(float)
    threads: dict[str, int] = collections.Counter()
    procs: dict[str, set] = collections.defaultdict(set)
    top = []
    for key, ticks in after.items():
        role, pid, _tid, name = key
        used = (ticks - before.get(key, 0)) / TICK / (t1 - t0)
        busy[role] += used
        threads[role] += 1
        procs[role].add(pid)
        top.append((used, role, name))
    top.sort(reverse=True)
    rate = sum((s1[r][0] - s0[r][0]) * batch / (t1 - t0) for r in s1 if r in s0)
    waits = [w for r in s1 for w in s1[r][1][len(s0.get(r, (0, []))[1]):]]
    return {"img_s": round(rate), "data_wait": round(sum(waits) / max(1, len(waits)), 3),
            "host_cores_busy": round(host, 1), "cores": psutil.cpu_count(),
            "roles": {r: {"processes": len(procs[r]), "threads": threads[r],
                          "cores_busy": round(busy[r], 2)} for r in sorted(busy)},
            "busiest_threads": [[round(u, 2), r, n] for u, r, n in top[:12]],
            "jpg_util": _jpg(out)}


def _roles(parent: int, log: str) -> dict[int, str]:
    """pid -> role: the run's processes, named by what the log says of the ranks."""
    ranks = {}
    for ev in _events(log):
        if ev["kind"] == "rank" and ev.get("pid"):
            ranks[ev["pid"]] = f"rank {ev['rank']}"
    roles = {parent: "ddptui"}
    for p in psutil.Process(parent).children(recursive=True):
        roles[p.pid] = ranks.get(p.pid, "fork server" if "forkserver" in " ".join(p.cmdline())
                                 else "other")
    for pid, role in list(roles.items()):
        if role.startswith("rank"):
            for c in psutil.Process(pid).children(recursive=True):
                roles[c.pid] = f"{role} workers"
    return roles


def _ticks(roles: dict[int, str]) -> dict[tuple, int]:
    out = {}
    for pid, role in roles.items():
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                stat = open(f"/proc/{pid}/task/{tid}/stat").read()
            except OSError:
                continue
            name = stat[stat.index("(") + 1:stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2:].split()
            out[(role, pid, tid, name)] = int(fields[11]) + int(fields[12])  # utime + stime
    return out


def _steps(log: str) -> dict[int, tuple[int, list[float]]]:
    """rank -> (its last global step, its step events' data-wait so far)."""
    out: dict[int, tuple[int, list[float]]] = {}
    for ev in _events(log):
        if ev["kind"] == "step":
            gs, waits = out.get(ev["rank"], (0, []))
            out[ev["rank"]] = (max(gs, ev["global_step"]), waits + [ev.get("data_wait") or 0.0])
    return out


def _last_step(log: str) -> int:
    return _steps(log).get(0, (0, []))[0] if os.path.exists(log) else 0


def _events(log: str) -> list[dict]:
    """The log's whole lines (the last may still be being written)."""
    out = []
    for line in open(log):
        try:
            out.append(json.loads(line))
        except ValueError:
            pass
    return out


def _jpg(dmon: str) -> float | None:
    """The mean of dmon's jpg column (NVJPG engines busy, %) over its samples, all GPUs."""
    head, values = None, []
    for line in dmon.splitlines():
        if line.startswith("#") and "jpg" in line:
            head = line.lstrip("#").split()
        elif head and not line.startswith("#") and line.strip():
            cells = line.split()
            if len(cells) == len(head) and cells[head.index("jpg")].isdigit():
                values.append(int(cells[head.index("jpg")]))
    return round(sum(values) / len(values), 1) if values else None


if __name__ == "__main__":
    main()
