"""`ddptui attach --listen` killed and started again on the same log mid-job, and `ddptui replay`
of that log: how soon each draws the whole job. The ranks are bench/scale.py's simulated ones,
each node's through a real relay (which holds its node's events while attach is away).

python bench/restart.py --ranks 512 --seconds 150 --kill-at 90
- attach runs headless for --kill-at seconds, keeping its state beside the log every 10 s, and
  is SIGKILLed; a new process (its start timed from before its spawn) then imports ddptui, reads
  the kept state and draws its dashboard at 160x50 under Pilot: "full screen" is its first
  screen showing every rank; "all back" is when every rank still running has reported to it.
  Measured besides: the kept state's size and what one keep costs.
- then the log is played by `ddptui replay` at --speed 1 and 0 (in a Pilot app as well): when
  every rank is on its screen, and at speed 0, how long the whole log takes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import tempfile
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from scale import KEY, STALLED, Plan, _free_port, player, start_relays  # noqa: E402


def shown_in_full(app, ranks: int) -> list[float]:
    """[when the app first displayed a screen with every rank] (time.time()), once it has."""
    seen: list[float] = []
    display = app._display

    def timed_display(screen, renderable):
        display(screen, renderable)
        if not seen and renderable is not None and app.view and len(app.view.ranks) >= ranks:
            seen.append(time.time())

    app._display = timed_display
    return seen


async def restarted(address: tuple[str, int], log: str, ranks: int, spawned: float,
                    until: float) -> dict:
    """The child: attach again on `log`, under Pilot, its start timed from `spawned`."""
    from ddptui.dashboard.sources.attach import Attach
    from ddptui.dashboard.sources.kept_state import encoded, fields_of, path_of, write
    from ddptui.dashboard.view.app import DashboardApp

    job = Attach(address, KEY.encode(), log, "bench")
    app = DashboardApp(job)
    seen = shown_in_full(app, ranks)
    # the ranks to hear from again: those still running, but the one stalled (it never steps)
    # and the cut node's (silent since 2/3 of the run)
    live = {r for r, v in job.state.ranks.items()
            if not v.state.is_final and v.state.value != "unreachable"} - {STALLED}
    async with app.run_test(size=(160, 50)) as pilot:
        while not seen:
            await pilot.pause(0.05)
        full = seen[0] - spawned
        back = None
        while time.time() < until:
            with job._lock:  # a step or a line sent since this attach began
                heard = {r for r, s in job._watch.silence.items()
                         if s.last is not None and s.last > spawned}
            if back is None and live <= heard:
                back = time.time() - spawned
            await pilot.pause(0.25)
        with job._lock:  # one keep, as attach's watch thread makes one every 10 s
            t = time.perf_counter()
            data = encoded(log, job.state, fields_of(job._world_size, job._finished, job._ends,
                                                     list(job._watch.silence),
                                                     job._watch.places, None))
            held_ms = 1000 * (time.perf_counter() - t)
        write(log, data)
        keep_ms, size = 1000 * (time.perf_counter() - t), len(data)
        await pilot.press("q")
    return {"full_screen_s": round(full, 2), "all_back_s": back and round(back, 2),
            "kept_mb": round(size / 2**20, 1), "keep_ms": round(keep_ms), "held_ms": round(held_ms),
            "kept_file_mb": round(os.path.getsize(path_of(log)) / 2**20, 1)}


async def replayed(log: str, ranks: int, speed: float) -> dict:
    """`ddptui replay` of the log at `speed` in a Pilot app: when every rank is on screen, and
    (speed 0) when the log is played to its end."""
    from ddptui.dashboard.sources.replay import Replay
    from ddptui.dashboard.view.app import DashboardApp

    t0 = time.time()
    source = Replay(log, speed)
    app = DashboardApp(source)
    seen = shown_in_full(app, ranks)
    async with app.run_test(size=(160, 50)) as pilot:
        while not seen:
            await pilot.pause(0.05)
        ended = None
        if speed == 0:
            while not source.done.is_set():
                await pilot.pause(0.25)
            ended = time.time() - t0
        await pilot.press("q")
    return {"speed": speed, "full_screen_s": round(seen[0] - t0, 2),
            "to_the_end_s": ended and round(ended, 1)}


def own_pace(log: str) -> float:
    """Seconds from the log's first line to the first line of its last rank to appear."""
    first, seen = None, {}
    with open(log) as f:
        for line in f:
            e = json.loads(line)
            first = e["t"] if first is None else first
            if e.get("rank", -1) >= 0:
                seen.setdefault(e["rank"], e["t"])
    return max(seen.values()) - first


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=512)
    ap.add_argument("--per-node", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=150.0)
    ap.add_argument("--kill-at", type=float, default=90.0)
    ap.add_argument("--child", nargs=5, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:  # host port log spawned until
        host, port, log, spawned, until = args.child
        print(json.dumps(asyncio.run(restarted((host, int(port)), log, args.ranks,
                                               float(spawned), float(until)))))
        return
    plan = Plan(args.ranks, args.per_node, args.seconds, True, 0.0, 2, 5.0, True)
    folder = tempfile.mkdtemp(prefix="ddptui-restart-")
    log = os.path.join(folder, "attach.jsonl")
    address = ("127.0.0.1", _free_port())
    env = {**os.environ, "DDPTUI_AUTHKEY": KEY}
    listen = ["-m", "ddptui", "attach", "--listen", f"{address[0]}:{address[1]}", "--log", log]
    attach = subprocess.Popen([sys.executable, *listen, "--headless"], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(3.0)
    relays = start_relays(plan, address, env)
    t0 = time.time() + 3.0
    spawn, out = mp.get_context("spawn"), mp.get_context("spawn").Queue()
    players = [spawn.Process(target=player, args=(list(range(i, plan.ranks, 2)), plan, address,
                                                  t0, out)) for i in range(2)]
    for p in players:
        p.start()
    time.sleep(max(0.0, t0 + args.kill_at - time.time()))
    attach.send_signal(signal.SIGKILL)
    attach.wait()
    spawned = time.time()
    child = subprocess.run([sys.executable, __file__, "--ranks", str(args.ranks), "--child",
                            *map(str, address), log, str(spawned), str(t0 + args.seconds)],
                           env=env, capture_output=True, text=True)
    if child.returncode:
        raise SystemExit(f"the restarted attach failed:\n{child.stderr[-3000:]}")
    row = json.loads(child.stdout.strip().splitlines()[-1])
    for p in players:
        p.join(timeout=60)
    for r in relays:
        r.terminate()
    psutil.wait_procs(relays, timeout=30)
    print(f"| {args.ranks} ranks, killed at {args.kill_at:g} s | full screen {row['full_screen_s']}"
          f" s | every rank reporting again {row['all_back_s']} s | kept state "
          f"{row['kept_file_mb']} MB, a keep {row['keep_ms']} ms (attach's lock held "
          f"{row['held_ms']} ms) |", flush=True)
    log_mb = os.path.getsize(log) / 2**20
    print(f"(in the log itself, its last rank's first word came {own_pace(log):.1f} s after its "
          "first line: what --speed 1 waits for)")
    for speed in (1.0, 0.0):
        r = asyncio.run(replayed(log, args.ranks, speed))
        print(f"| replay --speed {speed:g} of its log ({log_mb:.0f} MB) | full screen "
              f"{r['full_screen_s']} s | to its end: {r['to_the_end_s']} s |", flush=True)


if __name__ == "__main__":
    main()
