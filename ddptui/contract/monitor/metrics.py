"""The run's figures as Prometheus metrics, read from its RunState at each scrape (nothing is
counted twice, and a run nobody scrapes pays nothing): names, units and labels as Prometheus asks.
"""

from __future__ import annotations

import importlib.metadata
import os
import socket
from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
)

from ddptui.contract.state.runstate import RunState
from ddptui.contract.state.verdicts import gpus_of, judge
from ddptui.contract.state.views import STEP_BUCKETS, RankView, RunView
from ddptui.contract.states import RankState

RANK = ("run", "rank", "local_rank", "node")
GPU = ("run", "gpu", "uuid", "hostname", "node")
ENDS = ("crashed", "stopped", "done")


class RunCollector:
    """A prometheus_client collector over one run's state (registered on its own registry)."""

    def __init__(self, state: RunState, run: str):
        self.state, self.run = state, run
        self.hostname = socket.gethostname()
        self.versions = {"ddptui_version": _version("ddptui"), "torch_version": _version("torch")}

    def collect(self) -> Iterator[Metric]:
        view = self.state.view()
        yield self._info(view)
        yield from self._ranks(view)
        yield from self._phases(view)
        yield from self._gpus(view)
        yield from self._epochs(view)

    def _info(self, view: RunView) -> Metric:
        info = InfoMetricFamily("ddptui_run", "the run: what it trains, on how many ranks")
        meta = view.meta
        info.add_metric(["run"], {
            "run": self.run, "model": str(meta.get("model") or meta.get("script") or ""),
            "world_size": str(meta.get("world_size") or len(view.ranks)),
            "status": view.status, "device_kind": str(meta.get("device_kind") or ""),
            **self.versions})
        return info

    def _ranks(self, view: RunView) -> Iterator[Metric]:
        f = _Families(self.run)
        for r in view.ranks:
            labels = f.labels(r)
            f.samples.add_metric(labels, r.samples)
            f.steps.add_metric(labels, r.global_step)
            if r.loss is not None:
                f.loss.add_metric(labels, r.loss)
            f.wait.add_metric(labels, r.data_wait)
            f.epoch.add_metric(labels, r.epoch)
            if r.last_step_t:
                f.last_step.add_metric(labels, r.last_step_t)
            f.restarts.add_metric(labels, r.restarts)
            for end in ENDS:
                f.ends.add_metric([*labels, end], r.ends.get(end, 0))
            for state in RankState:
                f.state.add_metric([*labels, state.value], 1.0 if r.state == state else 0.0)
            buckets, total = [], 0
            for bound, n in zip([*map(str, STEP_BUCKETS), "+Inf"], r.step_counts, strict=True):
                total += n
                buckets.append((bound, total))
            f.step_time.add_metric(labels, buckets, r.step_seconds)
        yield from f.all()

    def _phases(self, view: RunView) -> Iterator[Metric]:
        """Where each rank's step time goes (its last seconds), its memory, and the straggler
        the phases name (docs/dashboard.md)."""
        with self.state.lock:
            ranks = self.state.steptimes.copy()
        f = _Families(self.run)
        phase = GaugeMetricFamily("ddptui_step_phase_seconds", "a step's time in each phase: "
                                  "data, h2d, forward, backward, comm, optimizer, rest (mean "
                                  "over the rank's last seconds)", labels=(*RANK, "phase"))
        memory = GaugeMetricFamily("ddptui_rank_memory_bytes", "the rank's memory: allocated "
                                   "(in use), reserved (held by the caching allocator), peak",
                                   labels=(*RANK, "kind"))
        slow = GaugeMetricFamily("ddptui_straggler", "1 for a rank 15% or more slower than the "
                                 "others' median in its own time, in the phase that makes it",
                                 labels=(*RANK, "phase"))
        named = {f.rank: f.fields["phase"] for f in judge(ranks, gpus_of(view), view.settings)
                 if f.kind == "slow"}
        for r in view.ranks:
            times = ranks.get(r.rank)
            now = times.now() if times is not None else None
            if times is None or now is None:
                continue
            labels = f.labels(r)
            for name, ms in now[1].items():
                phase.add_metric([*labels, name], ms / 1000)
            for kind in ("allocated", "reserved", "peak"):
                if times.memory.get(kind) is not None:
                    memory.add_metric([*labels, kind], times.memory[kind] * 2**20)
            if r.rank in named:
                slow.add_metric([*labels, named[r.rank]], 1.0)
        yield from (phase, memory, slow)

    def _gpus(self, view: RunView) -> Iterator[Metric]:
        util = GaugeMetricFamily("ddptui_gpu_utilization_ratio", "GPU utilisation, 0-1 (NVML)",
                                 labels=GPU)
        used = GaugeMetricFamily("ddptui_gpu_memory_used_bytes", "GPU memory used", labels=GPU)
        total = GaugeMetricFamily("ddptui_gpu_memory_total_bytes", "GPU memory", labels=GPU)
        power = GaugeMetricFamily("ddptui_gpu_power_watts", "GPU power draw", labels=GPU)
        held = GaugeMetricFamily("ddptui_gpu_clock_throttled", "1 while NVML says the GPU's "
                                 "clocks are held down for this reason", labels=(*GPU, "reason"))
        for d in view.devices:
            if d.util is None or d.stale:  # a CPU rank's process tree, or no reading lately
                continue
            node, _, gpu = d.key.rpartition(" ")
            labels = [self.run, gpu.removeprefix("gpu"), d.uuid or "",
                      node.split("/")[0] if node else self.hostname, node]
            util.add_metric(labels, d.util / 100)
            if d.mem_used is not None:
                used.add_metric(labels, d.mem_used * 2**20)
            if d.mem_total is not None:
                total.add_metric(labels, d.mem_total * 2**20)
            if d.power_w is not None:
                power.add_metric(labels, d.power_w)
            for reason in d.held_down:
                held.add_metric([*labels, str(reason)], 1.0)
        yield from (util, used, total, power, held)

    def _epochs(self, view: RunView) -> Iterator[Metric]:
        bad = CounterMetricFamily("ddptui_bad_samples", "corrupt samples skipped, all ranks",
                                  labels=("run",))
        bad.add_metric([self.run], sum(e.get("bad_samples") or 0 for e in view.epochs))
        yield bad
        done = [e for e in view.epochs if not e.get("partial")]
        for name, key, what in (("ddptui_val_loss", "val_loss", "validation loss"),
                                ("ddptui_val_accuracy_ratio", "val_acc",
                                 "validation top-1 accuracy, 0-1")):
            last = next((e[key] for e in reversed(done) if e.get(key) is not None), None)
            if last is not None:
                family = GaugeMetricFamily(name, f"the last epoch's {what}", labels=("run",))
                family.add_metric([self.run], last)
                yield family


class _Families:
    """The per-rank families of one scrape."""

    def __init__(self, run: str):
        self.run = run
        self.samples = CounterMetricFamily("ddptui_samples", "samples trained", labels=RANK)
        self.steps = CounterMetricFamily("ddptui_steps", "optimizer steps", labels=RANK)
        self.loss = GaugeMetricFamily("ddptui_loss", "the latest training loss", labels=RANK)
        self.wait = GaugeMetricFamily("ddptui_data_wait_ratio", "share of the step time "
                                      "spent waiting for input, 0-1", labels=RANK)
        self.epoch = GaugeMetricFamily("ddptui_epoch", "the epoch, from 0", labels=RANK)
        self.last_step = GaugeMetricFamily("ddptui_last_step_timestamp_seconds", "when its "
                                           "last step was reported (unix time)", labels=RANK)
        self.restarts = CounterMetricFamily("ddptui_rank_restarts", "times it joined again",
                                            labels=RANK)
        self.ends = CounterMetricFamily("ddptui_rank_ends", "times it ended, by how",
                                        labels=(*RANK, "cause"))
        self.state = GaugeMetricFamily("ddptui_rank_state", "1 for the state it is in",
                                       labels=(*RANK, "state"))
        self.step_time = HistogramMetricFamily("ddptui_step_seconds", "step time", labels=RANK)

    def labels(self, r: RankView) -> list[str]:
        """A run on one machine: its node is this host, a rank's local rank its rank."""
        local = r.local_rank if r.local_rank is not None else None if r.node else r.rank
        return [self.run, str(r.rank), "" if local is None else str(local),
                r.node or r.host or os.uname().nodename]

    def all(self) -> tuple[Metric, ...]:
        return (self.samples, self.steps, self.loss, self.wait, self.epoch, self.last_step,
                self.restarts, self.ends, self.state, self.step_time)


def _version(package: str) -> str:
    """An installed package's version, from its metadata: torch is not imported for it (this
    process may hold no rank; attach's ranks are elsewhere, most often with the same)."""
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""
