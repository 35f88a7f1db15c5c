"""The dashboard's responsiveness and memory, driven by Pilot against replayed 8-rank logs.

python bench/dashboard.py --keys 40 --hour-speed 120 --out results.json
- key -> screen: 8 ranks each sending 20 step events a second (plus the parent's GPU readings,
  2 a second per GPU) replayed in real time; each key press (down/up, alternately) is timed from
  the press to the first screen update drawn with the selection moved (the app's display call).
- RSS: an hour of that log replayed at --hour-speed x from a file, the dashboard's RSS sampled
  every second while it plays.
- CPU: the share of one core the dashboard process uses while that log plays in real time (the
  rest of a core is the ranks' and the supervisor thread's, which shares the GIL with it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ddptui.dashboard.sources.replay import Replay  # noqa: E402
from ddptui.dashboard.view.app import DashboardApp  # noqa: E402

RANKS, STEP_HZ, GPU_HZ = 8, 20, 2


def flood(seconds: float, t0: float = 1_800_000_000.0):
    """Events of an 8-rank GPU run, in time order."""
    yield {"t": t0, "kind": "run", "rank": -1, "status": "started", "model": "resnet50",
           "data": "synthetic", "epochs": 90, "world_size": RANKS, "device_kind": "cuda",
           "batch_size": 256}
    for r in range(RANKS):
        yield {"t": t0, "kind": "rank", "rank": r, "state": "running", "pid": 1000 + r,
               "device": f"cuda:{r}", "gpu": r}
    per_epoch = 20 * 60 * STEP_HZ  # 20-minute epochs: three rows an hour
    for i in range(int(seconds * STEP_HZ)):
        t = t0 + i / STEP_HZ
        epoch, step = divmod(i, per_epoch)
        for r in range(RANKS):
            yield {"t": t, "kind": "step", "rank": r, "epoch": epoch, "step": step,
                   "global_step": i, "loss": 7.0 / (1 + i / 5000) + 0.01 * (r + i % 7),
                   "samples_per_s": 2900.0 + (i + r) % 50, "step_ms": 88.0 + (i + r) % 5,
                   "data_wait": 0.02, "progress": step / per_epoch}
        if step == per_epoch - 1:
            for r in range(RANKS):
                yield {"t": t, "kind": "epoch", "rank": r, "epoch": epoch, "start_step": 0,
                       "end_step": per_epoch, "partial": False, "world_size": RANKS,
                       "settings": {"prefetch": True, "workers": 8, "cudnn_benchmark": True},
                       "samples_per_s": 2900.0, "data_wait": 0.02, "seconds": 1200.0,
                       "train_loss": 1.0, "val_loss": 1.1, "val_acc": 0.5, "bad_samples": 0}
        if i % (STEP_HZ // GPU_HZ) == 0:
            for g in range(RANKS):
                yield {"t": t, "kind": "gpu", "rank": g, "gpu": g, "util": 97, "mem_used": 31200,
                       "mem_total": 143771, "power_w": 650.0, "temp_c": 55, "sm_clock": 1980,
                       "mem_clock": 3201, "held_down": [], "others": [], "pcie_rx": 400.0,
                       "pcie_tx": 10.0, "nvlink_rx": 21000.0, "nvlink_tx": 21000.0}


def track_cursor(app: DashboardApp) -> list[tuple[float, int]]:
    """(when, the ranks table's cursor row) at every screen the app displays from now on."""
    shown: list[tuple[float, int]] = []
    display = app._display

    def timed_display(screen, renderable):
        display(screen, renderable)
        if renderable is not None:
            shown.append((time.perf_counter(), app.rank_table.cursor_row))

    app._display = timed_display
    return shown


async def key_latency(keys: int) -> list[float]:
    """Seconds from each key press to the first display of a screen showing its effect."""
    # Played from a file as `ddptui replay` does: a list of the events would put 10^5 objects
    # in the bench's own heap for the garbage collector to walk.
    log = os.path.join(tempfile.mkdtemp(), "flood.jsonl")
    with open(log, "w") as f:
        f.writelines(json.dumps(ev, separators=(",", ":")) + "\n" for ev in flood(keys + 60.0))
    app = DashboardApp(Replay(log, speed=1.0))
    shown = track_cursor(app)
    latencies = []
    async with app.run_test(size=(160, 50)) as pilot:
        while app.rank_table.row_count < RANKS:
            await pilot.pause(0.1)
        await pilot.pause(2.0)  # charts drawn, the flood well under way
        for k in range(keys):
            key, want = ("down", 1) if k % 2 == 0 else ("up", 0)
            before = len(shown)
            start = time.perf_counter()
            await pilot.press(key)
            while not any(row == want for _, row in shown[before:]):
                await asyncio.sleep(0.001)
            latencies.append(next(t for t, row in shown[before:] if row == want) - start)
            await pilot.pause(0.25 + 0.1 * (k % 3))  # presses fall at all points of the cycles
        assert not app.source.done.is_set(), "the flood ended before the keys did"
        await pilot.press("q")
    return latencies


async def cpu_share(seconds: float) -> float:
    """Percent of one core used by this process over `seconds` of the flood in real time."""
    log = os.path.join(tempfile.mkdtemp(), "flood.jsonl")
    with open(log, "w") as f:
        f.writelines(json.dumps(ev, separators=(",", ":")) + "\n" for ev in flood(seconds + 20))
    me = psutil.Process()
    app = DashboardApp(Replay(log, speed=1.0))
    async with app.run_test(size=(160, 50)) as pilot:
        while app.rank_table.row_count < RANKS:
            await pilot.pause(0.1)
        await pilot.pause(5.0)  # charts drawn, caches warm
        cpu, start = sum(me.cpu_times()[:2]), time.monotonic()
        await pilot.pause(seconds)
        share = 100 * (sum(me.cpu_times()[:2]) - cpu) / (time.monotonic() - start)
        await pilot.press("q")
    return share


async def hour_rss(path: str, speed: float) -> list[tuple[float, float]]:
    """(seconds, RSS MiB) every second while an hour-long log plays at `speed` x."""
    me, samples = psutil.Process(), []
    app = DashboardApp(Replay(path, speed=speed))
    async with app.run_test(size=(160, 50)) as pilot:
        start = time.monotonic()
        while not app.source.done.is_set():
            samples.append((time.monotonic() - start, me.memory_info().rss / 2**20))
            await pilot.pause(1.0)
        samples.append((time.monotonic() - start, me.memory_info().rss / 2**20))
        await pilot.press("q")
    return samples


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--keys", type=int, default=40)
    ap.add_argument("--hour-speed", type=float, default=120.0)
    ap.add_argument("--seconds", type=float, default=3600.0, help="length of the RSS log")
    ap.add_argument("--out", default=None)
    ap.add_argument("--cpu", type=float, default=30.0, help="seconds of the CPU measurement")
    ap.add_argument("--only", choices=("cpu", "keys", "rss"), default=None)
    args = ap.parse_args()
    result: dict = {}
    if args.only in (None, "cpu"):
        result["cpu_percent"] = share = asyncio.run(cpu_share(args.cpu))
        print(f"CPU, 8 ranks x {STEP_HZ} step events/s in real time: {share:.0f}% of a core "
              f"over {args.cpu:.0f} s", flush=True)
    if args.only in (None, "keys"):
        ms = [1000 * x for x in sorted(asyncio.run(key_latency(args.keys)))]
        result.update(keys=len(ms), median_ms=statistics.median(ms),
                      p95_ms=ms[int(0.95 * (len(ms) - 1))], max_ms=ms[-1], latencies_ms=ms)
        print(f"key -> screen, 8 ranks x {STEP_HZ} step events/s: median "
              f"{result['median_ms']:.1f} ms, p95 {result['p95_ms']:.1f} ms, max "
              f"{result['max_ms']:.1f} ms ({len(ms)} keys)", flush=True)
    if args.only in (None, "rss"):
        result.update(hour_rss_figures(args.seconds, args.hour_speed))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)


def hour_rss_figures(seconds: float, speed: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "hour.jsonl")
        with open(path, "w") as f:
            n = 0
            for ev in flood(seconds):
                f.write(json.dumps(ev, separators=(",", ":")) + "\n")
                n += 1
        rss = asyncio.run(hour_rss(path, speed))
    first = next((mib for t, mib in rss if t >= 5), rss[0][1])
    peak = max(m for _, m in rss)
    print(f"RSS over {seconds / 3600:.1f} h of events ({n:,}) played in {rss[-1][0]:.0f} s: "
          f"{rss[0][1]:.0f} MiB at start, {first:.0f} after 5 s, peak {peak:.0f}"
          f", {rss[-1][1]:.0f} at the end", flush=True)
    return {"events": n, "rss_start_mib": rss[0][1], "rss_after_5s_mib": first,
            "rss_peak_mib": peak, "rss_end_mib": rss[-1][1], "play_s": rss[-1][0], "rss": rss}


if __name__ == "__main__":
    main()
