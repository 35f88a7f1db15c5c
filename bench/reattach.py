"""Reattach to a long run: a run's process holding an hour of events (8 ranks x 20 events a
second, folded as the run folded them) and still receiving 160 a second; a dashboard connects,
and the bench times its first full screen and how fast its keys reach the run.

    python bench/reattach.py [--ranks 8] [--hz 20] [--hours 1] [--presses 30]

Prints the hour's fold time (what a dashboard would spend replaying the log), the snapshot's
size, connect-to-full-screen, and the median and worst key-to-run times (a key sent as the
terminal's driver sends it, until the run's process takes the order), split into the time in
the dashboard and on the socket.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from ddptui.contract.protocol.codec import event_of  # noqa: E402
from ddptui.contract.protocol.events import PARENT  # noqa: E402
from ddptui.contract.protocol.updates import Hello  # noqa: E402
from ddptui.contract.socket.viewers import frame  # noqa: E402
from ddptui.contract.state.snapshot import dump  # noqa: E402
from ddptui.dashboard.sources.replay import Replay  # noqa: E402
from ddptui.run.host.host import RunHost  # noqa: E402


def events(ranks: int, hz: int, seconds: float, t0: float, first: bool = False,
           step: int = 0):
    """Per rank and second: `hz` events, 3 of 4 steps and 1 of 4 GPU readings; an epoch every
    five minutes; the run's start first (`first`)."""
    if first:
        yield {"t": t0, "kind": "run", "rank": PARENT, "status": "started", "model": "resnet50",
               "data": "imagefolder:/data", "epochs": 12, "world_size": ranks,
               "device_kind": "cuda", "batch_size": 256}
        for r in range(ranks):
            yield {"t": t0, "kind": "rank", "rank": r, "state": "running", "pid": 1000 + r,
                   "gpu": r, "device": f"cuda:{r}"}
        yield {"t": t0, "kind": "message", "rank": 0, "level": "info",
               "steps_per_epoch": 3000 * 5, "text": "resnet50: 25.6M parameters"}
    for i in range(int(seconds * hz)):
        t = t0 + i / hz
        for r in range(ranks):
            if i % 4 == 3:
                yield {"t": t, "kind": "gpu", "rank": r, "gpu": r, "util": 97.0, "mem_used": 40000,
                       "mem_total": 143771, "power_w": 600.0, "temp_c": 60}
            else:
                yield {"t": t, "kind": "step", "rank": r, "epoch": step // 15000,
                       "step": step % 15000, "global_step": step, "loss": 2.0 + 1 / (1 + step),
                       "samples_per_s": 2400.0, "step_ms": 105.0, "data_wait": 0.02,
                       "progress": (step % 15000) / 15000}
        if i % 4 != 3:
            step += 1
            if step % 15000 == 0:
                for r in range(ranks):
                    yield {"t": t, "kind": "epoch", "rank": r, "epoch": step // 15000 - 1,
                           "samples_per_s": 2400.0, "train_loss": 2.0, "seconds": 300.0,
                           "world_size": ranks, "samples": 15000 * 256, "data_wait": 0.02,
                           "settings": {"prefetch": True, "workers": 8, "cudnn_benchmark": True}}


class Served(Replay):
    """The run's side: an hour folded, then live events; every order's arrival is written."""

    can_steer = True
    owns_ranks = True

    def __init__(self, path: str, orders: str):
        super().__init__(path, speed=0, events=[])
        self.orders = open(orders, "a", buffering=1)

    def pause(self) -> None:
        self.orders.write(f"{time.monotonic()}\n")

    resume = pause


def serve(args) -> None:
    source = Served(args.log, args.orders)
    started = time.perf_counter()
    n, t0 = 0, time.time() - args.hours * 3600  # the hour ends now, and the run goes on
    for ev in events(args.ranks, args.hz, args.hours * 3600, t0, first=True):
        source.state.apply(event_of(ev))
        n += 1
    fold_s = time.perf_counter() - started
    started = time.perf_counter()
    snapshot = frame(Hello(name="bench", pid=0, log=args.log,
                           snapshot=dump(source.state)))
    dump_s = time.perf_counter() - started
    host = RunHost(source, args.socket, "bench")
    host.start()
    print(json.dumps({"events": n, "fold_s": round(fold_s, 2), "snapshot_bytes": len(snapshot),
                      "snapshot_encode_s": round(dump_s, 3)}), flush=True)
    step = n // args.ranks * 3 // 4  # the hour's steps
    while True:  # live: hz events a second per rank, as the hour had
        t = time.monotonic()
        for ev in events(args.ranks, args.hz, 1.0, time.time(), step=step):
            source.state.apply(event_of(ev))
        step += args.hz * 3 // 4
        time.sleep(max(0.0, 1.0 - (time.monotonic() - t)))


async def watch(args, sock: str, orders: str) -> dict:
    from textual.widgets import DataTable

    from ddptui.dashboard.background import connect
    from ddptui.dashboard.view.app import DashboardApp
    from ddptui.dashboard.view.widgets.charts import Chart

    started = time.monotonic()
    viewer = connect(sock)
    got_state = time.monotonic() - started
    app = DashboardApp(viewer)
    acted = []  # when the app's key handler sent each order (split: dashboard, socket)
    send = viewer._order

    def timed(op, note=None, **fields):
        acted.append(time.monotonic())
        send(op, note, **fields)

    viewer._order = timed
    async with app.run_test(size=(200, 60)) as pilot:
        while True:
            tables = list(app.query(DataTable))
            charts = [c for c in app.query(Chart) if c.display]
            if all(t.row_count for t in tables) and charts and all(c.drawn for c in charts):
                break
            await pilot.pause(0.01)
        full = time.monotonic() - started
        sent = []
        for _ in range(args.presses):
            sent.append(time.monotonic())
            await pilot.press("space")
            await pilot.pause(0.2)
        await pilot.pause(1.0)
        viewer.close()
        app.exit()
    with open(orders) as f:
        arrived = [float(line) for line in f]
    delays = [(a - s) * 1000 for s, a in zip(sent, arrived, strict=False)]
    handled = [(a - s) * 1000 for s, a in zip(sent, acted, strict=False)]
    carried = [(a - s) * 1000 for s, a in zip(acted, arrived, strict=False)]
    return {"state_s": round(got_state, 3), "full_screen_s": round(full, 3),
            "key_ms_median": round(statistics.median(delays), 1),
            "key_ms_max": round(max(delays), 1),
            "in_dashboard_ms_max": round(max(handled), 1), "on_socket_ms_max": round(max(carried), 1),
            "presses": len(sent), "arrived": len(arrived)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--hz", type=int, default=20)
    p.add_argument("--hours", type=float, default=1.0)
    p.add_argument("--presses", type=int, default=30)
    p.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--socket", help=argparse.SUPPRESS)
    p.add_argument("--orders", help=argparse.SUPPRESS)
    p.add_argument("--log", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        sock, orders = os.path.join(tmp, "run.sock"), os.path.join(tmp, "orders")
        host = subprocess.Popen([sys.executable, __file__, "--serve", "--socket", sock,
                                 "--orders", orders, "--log", os.path.join(tmp, "run.jsonl"),
                                 "--ranks", str(args.ranks), "--hz", str(args.hz),
                                 "--hours", str(args.hours)], stdout=subprocess.PIPE, text=True)
        try:
            folded = json.loads(host.stdout.readline())
            result = asyncio.run(watch(args, sock, orders))
        finally:
            host.kill()
            host.wait()
    print(json.dumps({**folded, **result, "ranks": args.ranks, "hz": args.hz,
                      "hours": args.hours}))


if __name__ == "__main__":
    main()
