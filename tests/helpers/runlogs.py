"""Made-up run logs with the telemetry schema of a real one, for screens that must not depend on
a machine: N ranks on N GPUs, steps and GPU readings at a steady rate, epochs, and optionally a
stopped and a crashed rank. Deterministic: the same arguments give the same events."""

from __future__ import annotations

import math
import time

from ddptui.contract.protocol.codec import event_of
from ddptui.contract.protocol.events import Event

T0 = 1_800_000_000.0


def gpu_run(ranks: int = 8, seconds: float = 120.0, step_hz: float = 4.0, gpu_hz: float = 2.0,
            epoch_s: float = 50.0, trouble: bool = False, finished: bool = False) -> list[dict]:
    """A resnet50 run on `ranks` GPUs. `trouble`: rank 1 is stopped at a third of the run (its
    standby ready), the last rank is killed at half (standby warming), prefetch is switched off
    at two thirds; the world shrinks accordingly."""
    evs: list[dict] = [{"t": T0, "kind": "run", "rank": -1, "status": "started",
                        "model": "resnet50", "data": "synthetic", "epochs": 4,
                        "world_size": ranks, "device_kind": "cuda", "batch_size": 256}]
    evs += [{"t": T0 + 0.1, "kind": "rank", "rank": r, "state": "running", "pid": 4000 + r,
             "device": f"cuda:{r}", "gpu": r} for r in range(ranks)]
    evs.append({"t": T0 + 0.2, "kind": "message", "rank": 0, "level": "info",
                "steps_per_epoch": int(epoch_s * step_hz), "text": "resnet50: 25.6M parameters"})
    settings = {"prefetch": True, "workers": 8, "cudnn_benchmark": True}
    evs.append({"t": T0 + 0.2, "kind": "settings", "rank": 0, "settings": dict(settings),
                "status": "applied", "epoch": 0})
    members = list(range(ranks))
    n = int(seconds * step_hz)
    per_epoch = int(epoch_s * step_hz)
    stop_at, kill_at, switch_at = n // 3, n // 2, 2 * n // 3
    for i in range(1, n + 1):
        t = T0 + 5.0 + i / step_hz
        if trouble and i in (stop_at, kill_at):
            gone = 1 if i == stop_at else ranks - 1
            members.remove(gone)
            evs.append({"t": t, "kind": "rank", "rank": gone,
                        "state": "stopped" if i == stop_at else "crashed",
                        "reason": "" if i == stop_at else "killed by SIGKILL",
                        "standby": "ready" if i == stop_at else "warming"})
            evs.append({"t": t + 0.01, "kind": "world", "rank": -1, "size": len(members),
                        "ranks": list(members), "generation": 1 + (i == kill_at),
                        "epoch": i // per_epoch, "step": i % per_epoch})
        if trouble and i == switch_at:
            settings["prefetch"] = False
            evs.append({"t": t, "kind": "settings", "rank": 0, "settings": dict(settings),
                        "status": "applied", "epoch": i // per_epoch})
        epoch, step = divmod(i, per_epoch)
        for r in members:
            slow = 1.25 if r == 2 else 1.0  # one rank's steps take longer: its bars stand out
            evs.append({"t": t + r * 0.001, "kind": "step", "rank": r, "epoch": epoch,
                        "step": step, "global_step": i,
                        "loss": 6.9 * math.exp(-i / n * 2.5) + 0.3 + 0.05 * math.sin(i + r),
                        "samples_per_s": 2900.0 / slow + 30 * math.sin(i / 7 + r),
                        "step_ms": 88.0 * slow + 4 * math.sin(i / 3 + r),
                        "data_wait": 0.02 + (0.2 if not settings["prefetch"] else 0.0),
                        "progress": step / per_epoch})
        if step == 0:
            for r in members:
                evs.append({"t": t + 0.05, "kind": "epoch", "rank": r, "epoch": epoch - 1,
                            "start_step": 0, "end_step": per_epoch, "partial": False,
                            "settings": dict(settings), "world_size": len(members),
                            "samples_per_s": 2880.0, "data_wait": 0.02, "seconds": epoch_s,
                            "samples": int(2880 * epoch_s),
                            "train_loss": 6.9 * math.exp(-i / n * 2.5) + 0.4,
                            "val_loss": 6.9 * math.exp(-i / n * 2.5) + 0.5,
                            "val_acc": min(0.9, i / n), "bad_samples": 0})
        if i % int(step_hz / gpu_hz) == 0:
            evs += _gpu_readings(t, ranks, members, i)
    if finished:
        evs.append({"t": evs[-1]["t"] + 1, "kind": "run", "rank": -1, "status": "done",
                    "exit_code": 0})
    return evs


def _gpu_readings(t: float, ranks: int, members: list[int], i: int) -> list[dict]:
    out = []
    for g in range(ranks):
        busy = g in members
        ev = {"t": t + 0.002 * g, "kind": "gpu", "rank": g, "gpu": g,
              "util": (96 + (i + g) % 4) if busy else 0, "mem_used": 31_200 if busy else 0,
              "mem_total": 143_771, "power_w": 640.0 + 10 * ((i + g) % 3) if busy else 72.0,
              "temp_c": 55 + g % 5, "sm_clock": 1980 if busy else 345, "mem_clock": 3201,
              "held_down": ["power cap"] if g == 5 and busy else [],
              "others": [[91234, 2_048, "alice", "python3"]] if g == 3 else [],
              "pcie_rx": 410.0 if busy else 0.0, "pcie_tx": 12.0 if busy else 0.0,
              "nvlink_rx": 21_000.0 if busy else 0.0, "nvlink_tx": 21_000.0 if busy else 0.0}
        out.append(ev)
    return out


def cluster_run(nodes: int = 8, per_node: int = 8, seconds: float = 60.0) -> list[dict]:
    """A job of `nodes` x `per_node` wrapped ranks as `ddptui attach` logs it (rolled up: a step
    event a second a rank): node 1 steps 12% slower, rank 35 stalls at two thirds of the run
    (its peers on the node go on), and node 6's GPU 2 is held down by its power cap."""
    ranks = nodes * per_node
    evs: list[dict] = [{"t": T0, "kind": "run", "rank": 0, "status": "started",
                        "model": "train.py", "script": "train.py --lr 0.1", "data": "",
                        "epochs": 0, "world_size": ranks, "device_kind": "cuda"}]
    node = [f"gpu{r // per_node:02d}/{r // per_node}" for r in range(ranks)]
    evs += [{"t": T0 + 0.1, "kind": "rank", "rank": r, "state": "running", "pid": 5000 + r,
             "gpu": r % per_node, "device": f"GPU {r % per_node}", "local_rank": r % per_node,
             "api": "ddptui.rank.wrap", "host": node[r].split("/")[0], "node": node[r]}
            for r in range(ranks)]
    for i in range(1, int(seconds) + 1):
        t = T0 + 2.0 + i
        for r in range(ranks):
            if r == 35 and i > 2 * seconds / 3:
                continue
            slow = 1.12 if r // per_node == 1 else 1.0
            evs.append({"t": t + r * 0.0001, "kind": "step", "rank": r, "epoch": 0,
                        "step": 20 * i, "global_step": 20 * i, "steps": 20, "node": node[r],
                        "loss": 6.9 * math.exp(-i / seconds * 2.5) + 0.01 * (r % 7),
                        "samples_per_s": 2900.0 / slow, "step_ms": 88.0 * slow,
                        "data_wait": 0.02 + 0.01 * (r % 3), "progress": i / 600})
            evs.append({"t": t + r * 0.0001, "kind": "gpu", "rank": r, "gpu": r % per_node,
                        "node": node[r], "util": 0 if r == 35 and i > 2 * seconds / 3 else 97,
                        "mem_used": 31_200, "mem_total": 81_559, "power_w": 650.0,
                        "temp_c": 55, "sm_clock": 1980,
                        "held_down": ["power cap"] if r == 6 * per_node + 2 else []})
    evs.append({"t": T0 + 2.0 + 2 * seconds / 3 + 5, "kind": "rank", "rank": 35,
                "state": "stalled", "reason": "idle for 5 s (CPU 0%, GPU idle)",
                "node": node[35]})
    return sorted(evs, key=lambda e: e["t"])


def script_run(seconds: float = 60.0, hang_at: float = 40.0) -> list[dict]:
    """Your own script on 2 GPUs, watched from outside: its output lines (loss read from them),
    its processes, GPU readings, an epoch row per printed epoch; at `hang_at` rank 1 is
    SIGSTOPped: stalled, and rank 0 waits for it in DDP's all-reduce."""
    evs: list[dict] = [{"t": T0, "kind": "run", "rank": -1, "status": "started", "pid": 100,
                        "restart": 0, "model": "train.py", "script": "train.py --lr 0.1",
                        "data": "", "epochs": 0, "world_size": 2, "device_kind": "cuda",
                        "gpus": [0, 1]}]
    evs += [{"t": T0 + 0.01, "kind": "rank", "rank": r, "state": "starting", "pid": 200 + r,
             "gpu": r, "device": f"GPU {r}"} for r in (0, 1)]
    evs += [{"t": T0 + 5.0, "kind": "rank", "rank": r, "state": "running"} for r in (0, 1)]
    for i in range(1, int(seconds * 2) + 1):
        t = T0 + 5.0 + i / 2
        hung = t >= T0 + hang_at
        for r in (0, 1):
            if not hung:
                epoch, step = divmod(i * 10, 300)
                loss = round(2.3 * math.exp(-i / 60) + 0.01 * r, 4)
                evs.append({"t": t, "kind": "step", "rank": r, "epoch": epoch, "step": step,
                            "global_step": step, "loss": loss, "steps": 1, "source": "output"})
                evs.append({"t": t, "kind": "output", "rank": r, "final": True,
                            "text": f"rank {r} epoch {epoch} step {step} loss: {loss:.4f}"})
                if step == 0 and epoch:
                    evs.append({"t": t, "kind": "epoch", "rank": r, "epoch": epoch - 1,
                                "seconds": 15.0, "samples": 0, "samples_per_s": 0.0,
                                "data_wait": 0.0, "settings": {}, "train_loss": loss + 0.1,
                                "val_loss": None, "val_acc": None, "metrics": {},
                                "source": "output"})
            stopped = hung and r == 1
            evs.append({"t": t, "kind": "process", "rank": r, "pid": 200 + r,
                        "status": "stopped" if stopped else "sleeping",
                        "cpu_percent": 0.0 if hung else 101.0 + r, "rss": 3100 + 10 * r,
                        "gpu_mem": 20480 + 512 * r})
            evs.append({"t": t, "kind": "gpu", "rank": r, "gpu": r, "util": 100 if not hung or
                        r == 0 else 0, "mem_used": 21000, "mem_total": 81559, "power_w": 400.0,
                        "temp_c": 50, "sm_clock": 1980, "mem_clock": 2619, "held_down": [],
                        "others": []})
    t = T0 + hang_at + 10.5
    evs.append({"t": t, "kind": "rank", "rank": 1, "state": "stalled", "pid": 201, "gpu": 1,
                "reason": "process stopped for 10 s", "process": "stopped", "cause": "stopped",
                "seconds": 10.0, "cpu_percent": 0.0, "gpu_activity": "idle"})
    evs.append({"t": t, "kind": "rank", "rank": 0, "state": "stalled", "pid": 200, "gpu": 0,
                "reason": "idle for 10 s (CPU 0%, GPU busy)", "cause": "silent", "seconds": 10.0})
    evs.append({"t": t + 2.1, "kind": "message", "rank": -1, "level": "warning",
                "text": "rank 1: no Python stacks: its process is stopped (SIGSTOP?)",
                "stacks_of": 1, "stacks": ""})
    evs.append({"t": t + 2.2, "kind": "rank", "rank": 0, "state": "waiting", "pid": 200,
                "gpu": 0, "reason": "in backward (DDP's gradient all-reduce): waiting for rank 1",
                "waiting_for": [1]})
    return sorted(evs, key=lambda e: e["t"])


def logged(kind: str, rank: int, **fields) -> Event:
    """The event a log line `{"kind": kind, "rank": rank, ...}` holds, decoded as ddptui reads
    one (tests write events as the log has them)."""
    ev = event_of({"t": fields.pop("t", round(time.time(), 3)), "kind": kind, "rank": rank,
                   **fields})
    assert ev is not None, f"not an event: {kind} {fields}"
    return ev


def typed(obj: dict | Event) -> Event:
    """A log line's event, decoded (an event already is one)."""
    ev = obj if isinstance(obj, Event) else event_of(obj)
    assert ev is not None, f"not an event: {obj}"
    return ev


def phased_run(seconds: float = 60.0, finished: bool = False) -> list[dict]:
    """gpu_run's 8 ranks (epochs of 10 s) with a `phases` window a second a rank: rank 5's GPU
    is held down by its power cap and its backward takes 30% longer, so the others wait for it
    in all-reduce; rank 3's memory peak grows 300 MiB an epoch."""
    evs = gpu_run(ranks=8, seconds=seconds, epoch_s=10.0)
    base = {"data": 2.0, "h2d": 1.0, "forward": 28.0, "backward": 50.0, "comm": 3.0,
            "optimizer": 4.0, "rest": 1.0}
    for s in range(1, int(seconds)):
        t = T0 + 5.0 + s
        for r in range(8):
            means = dict(base, backward=65.0) if r == 5 else dict(base, comm=18.0)
            means["forward"] += 0.5 * math.sin(s + r)
            step = sum(means.values())
            peak = 31_000.0 + (300.0 * (s // 10) if r == 3 else 0.0)
            evs.append({"t": t + r * 0.001, "kind": "phases", "rank": r, "steps": 10,
                        "step_ms": round(step, 3), "step_p90_ms": round(step * 1.05, 3),
                        "phases": {p: [round(ms, 3), round(ms * 1.1, 3)] for p, ms in
                                   means.items()},
                        "measured": list(means), "clock": "cuda", "global_step": s * 10,
                        "epoch": s // 10, "mem_kind": "cuda", "mem_allocated": peak - 2000,
                        "mem_reserved": peak + 500, "mem_peak": peak, "mem_limit": 143_771.0})
    evs.sort(key=lambda e: e["t"])
    if finished:
        evs.append({"t": evs[-1]["t"] + 1, "kind": "run", "rank": -1, "status": "done",
                    "exit_code": 0})
    return evs
