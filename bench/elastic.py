"""What stopping, restarting and losing a rank costs a running job: one run, driven through the
supervisor API (as the s/r keys do) plus a kill -9, timed from the events the ranks report.

python bench/elastic.py resnet18 --gpus 0,1 --data synthetic --amp bf16 --channels-last \
    --batch-size 256 --out elastic.json
Each row: the action, the world before and after, seconds from the action to the first step
finished in the new world, the longest stall of a rank that stayed, steps redone, img/s before
and after (5 s windows).
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import time

from ddptui.contract.jsonl import read_records
from ddptui.contract.options.config import DeviceOptions
from ddptui.contract.options.devices import resolve_devices
from ddptui.contract.options.parser import Parser
from ddptui.contract.options.training import add_training_options, config_from_args
from ddptui.run.builtin.supervisor import Supervisor


class Bench:
    def __init__(self, sup: Supervisor, log: str):
        self.sup, self.log = sup, log

    def events(self, kind: str | None = None) -> list[dict]:
        return [e for e in read_records(self.log) if kind is None or e["kind"] == kind]

    def wait(self, predicate, what: str, timeout: float = 180) -> None:
        deadline = time.time() + timeout
        while not predicate():
            if time.time() > deadline or self.sup.done.is_set():
                raise SystemExit(f"elastic bench: {what} not seen in {timeout} s")
            time.sleep(0.05)

    def world(self, gen: int) -> dict | None:
        return next((e for e in self.events("world") if e.get("generation") == gen
                     and e["rank"] >= 0), None)

    def throughput(self, t0: float, t1: float) -> float:
        """img/s of the whole world over [t0, t1], from the ranks' global steps."""
        steps = [e for e in self.events("step") if t0 <= e["t"] <= t1]
        by_rank: dict[int, list[dict]] = {}
        for e in steps:
            by_rank.setdefault(e["rank"], []).append(e)
        total = 0.0
        for evs in by_rank.values():
            if len(evs) >= 2:
                a, b = evs[0], evs[-1]
                total += (b["global_step"] - a["global_step"]) * self.sup.config.train.batch_size \
                    / max(b["t"] - a["t"], 1e-9)
        return total

    def change(self, action: str, gen: int, act, t_settle: float = 6.0) -> dict:
        before = self.throughput(time.time() - 5, time.time())
        size_before = len(self.sup.members)
        t0 = time.time()
        act()
        self.wait(lambda: self.world(gen), f"world generation {gen}")
        w = self.world(gen)
        self.wait(lambda: len(self.change_messages(t0)) >= w["size"], "first steps in the new world")
        firsts = self.change_messages(t0)
        time.sleep(t_settle)
        stayed = [m for m in firsts if m["rank"] in self.stayers]
        recovered = [e for e in self.events("message") if e.get("redone") is not None
                     and e["t"] >= t0]
        row = {"action": action, "world": f"{size_before} -> {w['size']}",
               "to_first_step_s": round(max(m["t"] for m in firsts) - t0, 3),
               "stall_s": round(max((m["change_s"] for m in stayed), default=0.0), 3),
               "steps_redone": recovered[0]["redone"] if recovered else 0,
               "img_s_before": round(before),
               "img_s_after": round(self.throughput(time.time() - t_settle + 1, time.time()))}
        print(row, flush=True)
        return row

    def change_messages(self, t0: float) -> list[dict]:
        return [e for e in self.events("message") if e.get("change_s") is not None
                and e["t"] >= t0]


def start(doc: str, name: str) -> tuple[Supervisor, Bench, object]:
    """Parse the run's options, start a long run and wait until it is past cudnn autotuning
    and worker start-up (and has a median step time)."""
    parser = Parser(description=doc)
    add_training_options(parser, DeviceOptions)
    parser.add_argument("--out", default=f"{name}.json")
    args = parser.parse_args()
    gpus, cpus = resolve_devices(args.gpus, args.cpus)
    config = config_from_args(args, gpus=gpus, cpus=cpus)
    config = config.replace(epochs=max(config.train.epochs, 1000))
    log = config.telemetry.log or f"{name}.jsonl"
    if os.path.exists(log):
        os.remove(log)
    sup = Supervisor(config, log)
    b = Bench(sup, log)
    sup.start()
    b.wait(lambda: sup.state.first_step_t, "first step", 300)
    time.sleep(12)
    return sup, b, args


def main() -> int:
    sup, b, args = start(__doc__, "elastic")
    config = sup.config
    last = max(sup.members)
    rows = []

    def standby_ready() -> bool:
        return sup.slots[last].state.value == "standby"

    b.stayers = set(sup.members) - {last}
    rows.append(b.change(f"s: stop rank {last}", 1, lambda: sup.stop_rank(last)))
    b.wait(standby_ready, "standby ready")
    time.sleep(3)
    rows.append(b.change(f"r: restart rank {last} (warm standby)", 2,
                         lambda: sup.restart_rank(last)))
    rows.append(b.change(f"kill -9 rank {last}", 3,
                         lambda: os.kill(sup.slots[last].process.pid, signal.SIGKILL)))
    b.wait(standby_ready, "standby ready")
    time.sleep(3)
    rows.append(b.change(f"r: restart rank {last} after the crash", 4,
                         lambda: sup.restart_rank(last)))
    b.stayers = set(sup.members) - {0}
    rows.append(b.change("s: stop rank 0", 5, lambda: sup.stop_rank(0)))
    sup.stop()
    code = sup.wait(120)
    with open(args.out, "w") as f:
        json.dump({"config": dataclasses.asdict(config), "rows": rows}, f, indent=1)
    print("| action | world | to first step (s) | longest stall of a rank that stayed (s) "
          "| steps redone | img/s before | img/s after |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['action']} | {r['world']} | {r['to_first_step_s']:.2f} | {r['stall_s']:.2f} "
              f"| {r['steps_redone']} | {r['img_s_before']:,} | {r['img_s_after']:,} |")
    return 0 if code in (0, 130) else 1


if __name__ == "__main__":
    sys.exit(main())
