"""Hundreds of ranks on many nodes against one `ddptui attach --headless --listen`, without torch
or GPUs: each simulated rank speaks a wrapped rank's report protocol (the key handshake, a Clock,
then its events, encoded by ddptui's codec) at a GPU rank's rates.

python bench/scale.py --ranks 64 256 512 1024 --per-node 8 --seconds 60 --out scale.json
- A rank sends 20 steps a second (loss, img/s, step time, data-wait, progress), its GPU's
  readings twice a second, its process figures and a line of output once a second: 24 events.
- Faults: node 1 steps 10% slower (a straggler); rank 3 stalls at 1/3 of the run (no steps, no
  output, CPU and GPU idle; it answers a stacks request as a wrapped rank does); rank 5 crashes at
  1/2; the last node's connections go silent at 2/3 without a close (a cut cable).
- --connect together: every rank connects in the same instant (a job after its rendezvous);
  staggered: spread evenly over --ramp seconds.
- Measured: ranks that appeared and when the last did; events sent, and steps logged against
  steps sent (lost); attach's CPU (share of one core) and peak RSS; stall -> flag and cut ->
  unreachable (s, from the attach log's stamps, one clock); the log's growth once it is thinned
  (from LOG_FULL_S + a minute on: --seconds 130 at least), as MB a day.
- --relay: each node's ranks report through a real relay process (ddptui/rank/wrap/relay.py)
  on a Unix socket, as wrapped ranks on a node of several do; measured besides: attach's
  threads, and the relays' CPU (their sum, and the busiest one).
- --screen KEYS: instead, attach and its dashboard in this process under Pilot (160x50) with the
  ranks connecting (with --relay, through a relay a node); up / down timed to the screen that
  shows the cursor moved; CPU and RSS. --minutes M: keys pressed for M minutes instead (KEYS at
  most), and the RSS and the key's p95 each minute printed: the dashboard over a long job.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import psutil

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from ddptui.contract.channel import connect  # noqa: E402
from ddptui.contract.protocol import events as ev  # noqa: E402
from ddptui.contract.protocol.codec import encode, message_of  # noqa: E402
from ddptui.contract.protocol.orders import AskStacks  # noqa: E402
from ddptui.contract.rollup import FULL_DETAIL_UP_TO, fold  # noqa: E402
from ddptui.dashboard.sources.thin_log import EVERY_S  # noqa: E402

KEY = "scale-bench-key"
LOG_FULL_S = 10.0
STEP_HZ, GPU_HZ, SLOW_NODE, STALLED, CRASHED = 20, 2, 1, 3, 5


@dataclass
class Plan:
    ranks: int
    per_node: int
    seconds: float
    together: bool
    ramp: float
    players: int
    stall_after: float
    relay: bool = False

    def node(self, rank: int) -> int:
        return rank // self.per_node

    @property
    def cut_node(self) -> int:
        return (self.ranks - 1) // self.per_node


class Sim:
    """One simulated rank: connect, say its clock and who it is, then its events at their
    rates until the plan says otherwise."""

    def __init__(self, rank: int, plan: Plan, address: tuple[str, int], t0: float):
        self.rank, self.plan, self.t0 = rank, plan, t0
        self.node = f"sim{plan.node(rank)}"
        self.address: tuple[str, int] | str = relay_name(address, plan.node(rank)) \
            if plan.relay else address
        self.sent: dict[str, int] = {}
        self.connected_after: float | None = None
        self.retries = 0
        self.writer: asyncio.StreamWriter | None = None
        self.every = 1.0 if plan.ranks > FULL_DETAIL_UP_TO else 0.0
        self.held: list[ev.Event] = []
        self.steps_made = 0

    async def open(self, pool: ThreadPoolExecutor) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn = await loop.run_in_executor(pool, connect, self.address, KEY.encode())
                break
            except (OSError, EOFError):
                self.retries += 1
                await asyncio.sleep(2.0)
        fd = os.dup(conn.fileno())
        conn.close()
        reader, self.writer = await asyncio.open_connection(sock=socket.socket(fileno=fd))
        self.connected_after = time.time() - self.t0
        asyncio.create_task(self.orders(reader))
        self.send(ev.Clock(rank=self.rank))
        self.send(ev.Rank(rank=self.rank, state="running", pid=100_000 + self.rank,
                          host=self.node, gpu=self.rank % self.plan.per_node,
                          device=f"GPU {self.rank % self.plan.per_node}", api="ddptui.rank.wrap",
                          local_rank=self.rank % self.plan.per_node))
        if self.rank == 0:
            self.send(ev.Run(rank=0, status="started", model="train.py", script="train.py",
                             data="", epochs=0, world_size=self.plan.ranks, device_kind="cuda"))

    def send(self, event: ev.Event) -> None:
        """As a rank's link sends: at once in a job of up to 16 ranks, else gathered and folded
        once a second (ddptui/contract/rollup.py)."""
        self.held.append(event.replace(node=self.node))
        if not self.every or event.t - self.held[0].t >= self.every:
            self.flush()

    def flush(self) -> None:
        assert self.writer is not None
        for event in fold(self.held) if self.every else self.held:
            data = encode(event).encode()
            self.writer.write(struct.pack("!i", len(data)) + data)
            kind = type(event).__name__.lower()
            self.sent[kind] = self.sent.get(kind, 0) + 1
        self.held = []

    async def orders(self, reader: asyncio.StreamReader) -> None:
        """A stacks request is answered as a wrapped rank's sidecar answers it."""
        try:
            while True:
                size = struct.unpack("!i", await reader.readexactly(4))[0]
                order = message_of(await reader.readexactly(size))
                if isinstance(order, AskStacks):
                    self.send(ev.Stacks(rank=self.rank, stacks_of=self.rank, level="info",
                                        text=f"rank {self.rank}'s stacks",
                                        stacks='File "train.py", line 88 in train_step'))
        except (asyncio.IncompleteReadError, OSError, ValueError):
            pass

    async def play(self) -> None:
        plan, step, due = self.plan, 0, time.time()
        slow = 1.1 if plan.node(self.rank) == SLOW_NODE else 1.0
        stall_at, crash_at, cut_at = (plan.seconds * f for f in (1 / 3, 1 / 2, 2 / 3))
        while (now := time.time() - self.t0) < plan.seconds:
            if self.rank == CRASHED and now >= crash_at:
                self.send(ev.Error(rank=self.rank, text="RuntimeError: simulated", exit_code=1,
                                   traceback=["RuntimeError: simulated"], pid=100_000 + self.rank))
                self.send(ev.Rank(rank=self.rank, state="crashed", exit_code=1,
                                  reason="RuntimeError: simulated", pid=100_000 + self.rank))
                self.flush()
                break
            if plan.node(self.rank) == plan.cut_node and now >= cut_at:
                await asyncio.sleep(plan.seconds - now)  # silent, never closed
                return
            stalled = self.rank == STALLED and now >= stall_at
            if not stalled:
                step += 1
                self.steps_made += 1
                self.send(ev.Step(rank=self.rank, epoch=0, step=step, global_step=step,
                                  loss=round(7.0 / (1 + step / 500), 4), steps=1,
                                  samples_per_s=round(2900.0 / slow, 2),
                                  step_ms=round(50.0 * slow, 3), data_wait=0.02,
                                  progress=round(step / 100_000, 5)))
            if step % (STEP_HZ // GPU_HZ) == 0 or stalled:
                self.send(ev.Gpu(rank=self.rank, gpu=self.rank % plan.per_node,
                                 util=0.0 if stalled else 97.0, mem_used=31200,
                                 mem_total=81559, power_w=650.0, temp_c=55.0, sm_clock=1980))
            if step % STEP_HZ == 0 or stalled:
                self.send(ev.Process(rank=self.rank, pid=100_000 + self.rank,
                                     status="sleeping" if stalled else "running",
                                     cpu_percent=0.0 if stalled else 100.0, rss=2048,
                                     opt_steps=step, moves=step))
                if not stalled:
                    self.send(ev.Output(rank=self.rank, text=f"step {step} loss 1.0",
                                        final=True))
            if self.writer:
                await self.writer.drain()
            due += 1.0 if stalled else 1.0 / STEP_HZ  # the rate holds whatever a send took
            await asyncio.sleep(max(0.0, due - time.time()))
        if self.writer:
            self.flush()
            self.writer.close()


async def _player(ranks: list[int], plan: Plan, address, t0: float) -> list[dict]:
    sims = [Sim(r, plan, address, t0) for r in ranks]
    with ThreadPoolExecutor(max_workers=len(sims)) as pool:
        async def one(sim: Sim) -> None:
            start = t0 + (0.0 if plan.together else plan.ramp * sim.rank / plan.ranks)
            await asyncio.sleep(max(0.0, start - time.time()))
            await sim.open(pool)
            await sim.play()
        await asyncio.gather(*(one(s) for s in sims))
    return [{"rank": s.rank, "node": plan.node(s.rank), "sent": s.sent, "connected_after": s.connected_after,
             "retries": s.retries, "steps": s.steps_made} for s in sims]


def player(ranks: list[int], plan: Plan, address, t0: float, out) -> None:
    out.put(asyncio.run(_player(ranks, plan, address, t0)))


def relay_name(address: tuple[str, int], node: int) -> str:
    """The abstract Unix socket name of the bench's relay of `node`."""
    return f"\0ddptui-bench-relay-{address[1]}-{node}"


def start_relays(plan: Plan, address: tuple[str, int], env: dict) -> list[psutil.Process]:
    """A relay process a node, as local rank 0's sidecar starts one, each up and listening."""
    nodes = plan.cut_node + 1
    relays = [subprocess.Popen(
        [sys.executable, "-m", "ddptui.rank.wrap.relay", "--report", f"{address[0]}:{address[1]}",
         "--path", "@" + relay_name(address, n)[1:], "--node", f"sim{n}",
         "--parent", str(os.getpid())], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL) for n in range(nodes)]
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        with open("/proc/net/unix") as f:
            listening = f.read().count(f"@ddptui-bench-relay-{address[1]}-")
        if listening >= nodes:
            return [psutil.Process(r.pid) for r in relays]
        time.sleep(0.5)
    raise SystemExit(f"only {listening} of {nodes} relays listened")


def _cpu(procs: list[psutil.Process]) -> list[float]:
    out = []
    for p in procs:
        try:
            t = p.cpu_times()
            out.append(t.user + t.system)
        except psutil.Error:
            out.append(0.0)
    return out


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(plan: Plan) -> dict:
    """One size: attach, the players, attach's CPU and RSS each second, then its log."""
    folder = tempfile.mkdtemp(prefix="ddptui-scale-")
    log = os.path.join(folder, "attach.jsonl")
    address = ("127.0.0.1", _free_port())
    # The log's first minutes in full shortened to LOG_FULL_S: its growth after is measured.
    env = {**os.environ, "DDPTUI_AUTHKEY": KEY, "DDPTUI_LOG_FULL_S": str(LOG_FULL_S)}
    attach = subprocess.Popen(
        [sys.executable, "-m", "ddptui", "attach", "--headless", "--listen",
         f"{address[0]}:{address[1]}", "--log", log, "--stall-after", str(plan.stall_after)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    proc = psutil.Process(attach.pid)
    deadline = time.monotonic() + 60
    while not any(c.status == psutil.CONN_LISTEN for c in proc.net_connections()):
        if attach.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"attach never listened (exit {attach.poll()})")
        time.sleep(0.1)
    relays = start_relays(plan, address, env) if plan.relay else []
    t0 = time.time() + 3.0  # the players are up by then
    spawn = mp.get_context("spawn")
    out = spawn.Queue()
    players = [spawn.Process(
        target=player, args=(list(range(i, plan.ranks, plan.players)), plan, address, t0, out))
        for i in range(plan.players)]
    for p in players:
        p.start()
    cpu0, rss, size0, threads, relay0 = proc.cpu_times(), 0, None, 0, _cpu(relays)
    while time.time() < t0 + plan.seconds:
        rss = max(rss, proc.memory_info().rss)
        threads = max(threads, proc.num_threads())
        if size0 is None and time.time() >= t0 + LOG_FULL_S + EVERY_S:  # thinned by then
            size0 = (os.path.getsize(log), time.time())
        time.sleep(1.0)
    grew = (os.path.getsize(log) - size0[0]) / (time.time() - size0[1]) if size0 else None
    cpu1, relay1 = proc.cpu_times(), _cpu(relays)
    sims = [s for _ in players for s in out.get(timeout=plan.seconds + 120)]
    for p in players:
        p.join()
    time.sleep(plan.stall_after + 3)  # the verdicts of the last seconds reach the log
    for r in relays:
        r.terminate()
    psutil.wait_procs(relays, timeout=30)
    attach.terminate()
    attach.wait(30)
    busy = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / plan.seconds
    spent = [(b - a) / plan.seconds for a, b in zip(relay0, relay1, strict=True)]
    return {**asdict(plan), **_read_log(log, plan, t0, sims), "attach_cpu": round(busy, 2),
            "attach_rss_mb": round(rss / 2**20), "attach_threads": threads,
            "relays_cpu": round(sum(spent), 2) if spent else None,
            "relay_cpu_max": round(max(spent), 3) if spent else None,
            "log_mb_a_day": None if grew is None else round(grew * 86400 / 2**20)}


async def screen(plan: Plan, keys: int, minutes: float = 0.0) -> dict:
    """The dashboard at scale: attach and its screen (160x50) in this process under Pilot, the
    ranks played by other processes; up / down timed from the press to the first screen drawn
    with the cursor moved (as bench/dashboard.py), and this process's CPU and RSS meanwhile
    (its peak, and each minute's for a run of `minutes`)."""
    from dashboard import track_cursor  # bench/dashboard.py's, timed the same way

    from ddptui.dashboard.sources.attach import Attach
    from ddptui.dashboard.view.app import DashboardApp

    folder = tempfile.mkdtemp(prefix="ddptui-scale-screen-")
    os.environ["DDPTUI_LOG_FULL_S"] = str(LOG_FULL_S)
    job = Attach(("127.0.0.1", _free_port()), KEY.encode(), os.path.join(folder, "a.jsonl"),
                 "bench", stall_after=plan.stall_after)
    app = DashboardApp(job)
    shown = track_cursor(app)
    spawn, me, latencies = mp.get_context("spawn"), psutil.Process(), []
    relays = start_relays(plan, job.address, {**os.environ, "DDPTUI_AUTHKEY": KEY}) \
        if plan.relay else []
    t0 = time.time() + 5.0  # the players start before the app (none can be spawned inside it)
    out = spawn.Queue()
    players = [spawn.Process(target=player, args=(list(range(i, plan.ranks, plan.players)),
                                                   plan, job.address, t0, out))
               for i in range(plan.players)]
    for p in players:
        p.start()
    _pin(me, players, relays)
    async with app.run_test(size=(160, 50)) as pilot:
        while not (app.view and len(app.view.ranks) == plan.ranks):
            _alive(app)
            await pilot.pause(0.2)
        appeared = time.time() - t0
        cpu0, rss, each_minute, mark = sum(me.cpu_times()[:2]), 0, [], 0
        start = time.monotonic()
        for k in range(keys):
            if minutes and time.monotonic() - start >= 60 * len(each_minute):
                each_minute.append((round(me.memory_info().rss / 2**20), _p95(latencies[mark:])))
                mark = len(latencies)
                if len(each_minute) > minutes:
                    break
            before, row = len(shown), app.rank_table.cursor_row
            pressed = time.perf_counter()
            await pilot.press("down" if k % 2 == 0 else "up")
            while not any(r != row for _, r in shown[before:]):
                _alive(app)
                await asyncio.sleep(0.001)
            latencies.append(next(t for t, r in shown[before:] if r != row) - pressed)
            rss = max(rss, me.memory_info().rss)
            await pilot.pause(0.25 + 0.1 * (k % 3))
        busy = (sum(me.cpu_times()[:2]) - cpu0) / (time.monotonic() - start)
        for p in players:
            p.terminate()
        for r in relays:
            r.terminate()
        await pilot.press("q")
    psutil.wait_procs(relays, timeout=30)
    return {"ranks": plan.ranks, "all_in_s": round(appeared, 2), "p50_ms": round(
        1000 * statistics.median(latencies), 1), "p95_ms": _p95(latencies),
            "process_cpu": round(busy, 2), "rss_mb": round(rss / 2**20),
            "each_minute": each_minute}


def _alive(app) -> None:
    """A dashboard that failed ends the bench (its waits would never end)."""
    if app.return_code is not None:
        raise SystemExit(f"the dashboard ended ({app.return_code}) before the bench did")


def _p95(latencies: list[float]) -> float | None:
    ms = sorted(1000 * x for x in latencies)
    return round(ms[int(0.95 * (len(ms) - 1))], 1) if ms else None


def _screen_row(plan: Plan, keys: int, minutes: float, rows) -> None:
    rows.put(asyncio.run(screen(plan, keys, minutes)))


def _pin(me: psutil.Process, players: list, relays: list[psutil.Process]) -> None:
    """The simulated job (players, relays) on the last CPU, the dashboard on the others: on a
    small machine they would otherwise take turns on the same cores, and a key would wait for
    the job's processes, which in a real job run on other machines."""
    cpus = me.cpu_affinity()
    if len(cpus) < 2 or os.environ.get("SCALE_PIN") == "0":
        return
    me.cpu_affinity(cpus[:-1])
    for p in [*(psutil.Process(p.pid) for p in players), *relays]:
        p.cpu_affinity(cpus[-1:])


def _read_log(log: str, plan: Plan, t0: float, sims: list[dict]) -> dict:
    steps_logged: dict[int, int] = {}
    ranks_seen: set[int] = set()
    stalled_at = unreachable_at = None
    with open(log) as f:
        for line in f:
            e = json.loads(line)
            r = e.get("rank", -1)
            if e["kind"] == "step" and plan.node(r) != plan.cut_node:
                steps_logged[r] = steps_logged.get(r, 0) + (e.get("steps") or 1)
            elif e["kind"] == "rank" and r >= 0:
                ranks_seen.add(r)
                if r == STALLED and e["state"] == "stalled" and stalled_at is None:
                    stalled_at = e["t"] - (t0 + plan.seconds / 3)
                if (plan.node(r) == plan.cut_node and e["state"] == "unreachable"
                        and unreachable_at is None):
                    unreachable_at = e["t"] - (t0 + plan.seconds * 2 / 3)
    # The cut node's last second, held in its links when the cable went, is lost for good.
    steps_sent = sum(s["steps"] for s in sims if s["node"] != plan.cut_node)
    connected = [s["connected_after"] for s in sims if s["connected_after"] is not None]
    return {"appeared": len(ranks_seen), "last_in_s": round(max(connected), 2),
            "retries": sum(s["retries"] for s in sims),
            "events_sent": sum(sum(s["sent"].values()) for s in sims),
            "steps_sent": steps_sent, "steps_lost": steps_sent - sum(steps_logged.values()),
            "stall_to_flag_s": None if stalled_at is None else round(stalled_at, 1),
            "cut_to_unreachable_s": None if unreachable_at is None else round(unreachable_at, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, nargs="+", default=[64, 256])
    ap.add_argument("--per-node", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=60.0)
    ap.add_argument("--connect", choices=["together", "staggered"], nargs="+",
                    default=["together"])
    ap.add_argument("--ramp", type=float, default=10.0, help="staggered: over this many s")
    ap.add_argument("--players", type=int, default=2, help="processes playing the ranks")
    ap.add_argument("--stall-after", type=float, default=5.0)
    ap.add_argument("--relay", action="store_true", help="each node's ranks through a relay")
    ap.add_argument("--screen", type=int, default=0, metavar="KEYS",
                    help="instead: the dashboard's key -> screen over KEYS presses, in-process")
    ap.add_argument("--minutes", type=float, default=0.0,
                    help="--screen: press keys for this long, RSS and p95 printed each minute")
    ap.add_argument("--out")
    args = ap.parse_args()
    if args.screen:
        print("| ranks | all in (s) | key -> screen p50 (ms) | p95 (ms) | dashboard CPU | RSS (MB) |")
        print("|---|---|---|---|---|---|")
        for n in args.ranks:
            plan = Plan(n, args.per_node, max(3600.0, 60 * args.minutes + 300), True, 0.0,
                        args.players, args.stall_after, args.relay)
            # Each size in a process of its own: the one before leaves threads and objects
            # behind (its attach, its app) that weighed on the next one's keys.
            spawn = mp.get_context("spawn")
            rows = spawn.Queue()
            one = spawn.Process(target=_screen_row, args=(plan, args.screen, args.minutes, rows))
            one.start()
            row = rows.get()
            one.join()
            print(f"| {n} | {row['all_in_s']} | {row['p50_ms']} | {row['p95_ms']} | "
                  f"{row['process_cpu']:.2f} | {row['rss_mb']} |", flush=True)
            if args.minutes:
                print(f"  {n} ranks, each minute: RSS (MB), key p95 (ms): "
                      f"{row['each_minute']}", flush=True)
        return
    rows = []
    print("| ranks | connect | appeared | last in (s) | events sent | steps lost | attach CPU "
          "| RSS (MB) | threads | relays' CPU (sum, busiest) | stall -> flag (s) "
          "| cut -> unreachable (s) | log MB a day |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for n in args.ranks:
        for how in args.connect:
            row = measure(Plan(n, args.per_node, args.seconds, how == "together", args.ramp,
                               args.players, args.stall_after, args.relay))
            rows.append(row)
            relays = "-" if row["relays_cpu"] is None else \
                f"{row['relays_cpu']:.2f}, {row['relay_cpu_max']:.3f}"
            print(f"| {n} | {how} | {row['appeared']} | {row['last_in_s']} | "
                  f"{row['events_sent']:,} | {row['steps_lost']:,} | {row['attach_cpu']:.2f} | "
                  f"{row['attach_rss_mb']} | {row['attach_threads']} | {relays} | "
                  f"{row['stall_to_flag_s']} | {row['cut_to_unreachable_s']} | "
                  f"{row['log_mb_a_day']} |", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
