"""What a live input-pipeline change does: one run, settings switched through the supervisor API
(as the dashboard's p/w/W/b keys do), one table row per epoch or part of one.

python bench/settings_switch.py resnet18 --gpus 0,1 --data shapes --switch workers=1 prefetch=false
Without --now each change waits for the next epoch boundary; with --now S, a change is made
every S seconds and applied at once (the `a` key), so one epoch shows before and after.
"""

from __future__ import annotations

import os
import sys
import time

from ddptui.contract.jsonl import read_records
from ddptui.contract.options.config import DeviceOptions
from ddptui.contract.options.devices import resolve_devices
from ddptui.contract.options.parser import Parser
from ddptui.contract.options.training import add_training_options, config_from_args
from ddptui.run.builtin.supervisor import Supervisor


def parse_switch(items: list[str]) -> list[dict]:
    """Each item `name=value[,name=value]` is one change, made one epoch after the previous."""
    changes = []
    for item in items:
        change = {}
        for pair in item.split(","):
            name, _, value = pair.partition("=")
            change[name] = value.lower() == "true" if value.lower() in ("true", "false") \
                else int(value)
        changes.append(change)
    return changes


def main() -> int:
    parser = Parser(description=__doc__)
    add_training_options(parser, DeviceOptions)
    parser.add_argument("--switch", nargs="+", default=[])
    parser.add_argument("--now", type=float, default=None, metavar="S")
    args = parser.parse_args()
    gpus, cpus = resolve_devices(args.gpus, args.cpus)
    config = config_from_args(args, gpus=gpus, cpus=cpus)
    log = config.telemetry.log or "settings_switch.jsonl"
    if os.path.exists(log):
        os.remove(log)  # the figures below read it from the start
    sup = Supervisor(config, log)
    sup.start()
    while not sup.state.first_step_t and not sup.done.is_set():
        time.sleep(0.1)
    for change in parse_switch(args.switch):
        if args.now:
            time.sleep(args.now)
            sup.change_settings(**change)
            sup.apply_now()
            continue
        seen = len(sup.state.view().epochs)
        while len(sup.state.view().epochs) <= seen and not sup.done.is_set():
            time.sleep(0.1)
        sup.change_settings(**change)
    code = sup.wait()
    print("| epoch | steps | ranks | prefetch | workers | cudnn.benchmark | img/s | data-wait |")
    print("|---|---|---|---|---|---|---|---|")
    for e in sup.state.view().epochs:
        s = e["settings"]
        print(f"| {e['epoch']} | {e['start_step']}-{e['end_step']} | {e['world_size']} | "
              f"{s['prefetch']} | {s['workers']} | {s['cudnn_benchmark']} | "
              f"{e['samples_per_s']:,.0f} | {100 * e['data_wait']:.0f}% |")
    first = [e for e in read_records(log) if e["kind"] == "step"]
    if first:
        print(f"launch -> first step: {first[0]['t'] - sup.state.started_t:.1f} s")
    return code


if __name__ == "__main__":
    sys.exit(main())
