"""The run state: everything the dashboard and the headless console show, folded from events.

Fed by the supervisor thread (live) or by a replayed log; readers take `view()` under the lock.
Pure Python: no torch, no NVML, no psutil here.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING

from ddptui.contract.events import PARENT
from ddptui.contract.safe_text import keep_colours, plain
from ddptui.contract.state.epochs import EpochRow, LiveEpoch
from ddptui.contract.state.timeline import Timeline
from ddptui.contract.state.views import DeviceView, Progress, RankView, RunView, Vitals
from ddptui.contract.states import RankState
from ddptui.contract.wording import count, describe

if TYPE_CHECKING:
    from ddptui.contract import schema

STALE_S = 5.0  # readings come every 0.5 s: this much silence means none are coming
FRESH_S = 5.0  # a rank's throughput counts toward the total while this recent ...
FRESH_STEPS = 3  # ... or for this many of its steps, whichever is longer
# rank states the event pane shows as warnings
TROUBLE = frozenset({RankState.STALLED, RankState.CRASHED, RankState.SLOW})


def _fresh_for(r: RankView) -> float:
    return max(FRESH_S, FRESH_STEPS * r.step_ms / 1000)


class RunState:
    """Folds events into per-rank, per-device and per-epoch state, plus bounded histories."""

    def __init__(self, meta: dict | None = None, live: bool = True):
        self.lock = threading.Lock()
        self.live = live  # a live run's clock is the wall clock; a replay's is its last event
        self.meta = dict(meta or {})  # model, data, epochs, world_size, device_kind, log
        self.status = "starting"
        self.paused = False
        self.pause_asked: bool | None = None  # space pressed, the ranks not there yet
        self.started_t: float | None = None
        self.first_step_t: float | None = None
        self.ended_t: float | None = None
        self.ranks: dict[int, RankView] = {}
        self.devices: dict[str, DeviceView] = {}
        self.epochs: dict[tuple[int, int], EpochRow] = {}  # (epoch, first step) -> row
        self.settings: dict = {}
        self.pending: dict = {}
        self.asked: dict[str, dict] = {}  # requests rank 0 has not echoed yet, oldest first
        self.best_val_acc: float | None = None
        self.loss_lines: dict[int, Timeline] = {}  # rank -> its loss over the run
        self.rate_line = Timeline()  # the members' img/s
        self.wait_line = Timeline()  # their mean share of a step spent waiting for input, %
        self.marks: deque = deque(maxlen=200)  # (t, label): world and settings changes
        self.live_epoch = LiveEpoch()  # the epoch (or part) now running, for its row
        self.lines: deque = deque(maxlen=500)  # (seq, t, level, text, kind) for the event pane
        self.rank_said: dict[int, str] = {}  # the last line each rank's rank events made
        self.seq = 0
        self.exit_code: int | None = None
        self.reason = ""
        self.last_t = 0.0
        self.checkpoint_t: float | None = None
        self.host: dict = {}
        # Each change, as the run's viewers take it (ddptui/contract/socket/host.py), under the lock.
        self.listener: Callable[[dict], None] | None = None

    # -- writing -------------------------------------------------------------------------
    def apply(self, ev: dict) -> None:
        with self.lock:
            self._apply(ev)
            if self.listener:
                self.listener({"type": "event", "ev": ev})

    def say(self, text: str, level: str = "info", t: float | None = None) -> None:
        with self.lock:
            t = t or time.time()
            self._line(t, level, text)
            if self.listener:
                self.listener({"type": "say", "text": text, "level": level, "t": t})

    def _line(self, t: float, level: str, text: str, kind: str = "message") -> None:
        """`kind`: the event the line tells of, `rank:STATE` for a rank's (a console may show
        some kinds only)."""
        self.seq += 1
        # Text from ranks and remote peers: no escape sequence reaches a terminal raw.
        self.lines.append((self.seq, t, level, plain(text), kind))

    def _apply(self, ev: dict) -> None:
        kind, rank, t = ev["kind"], ev["rank"], ev.get("t", time.time())
        self.last_t = max(self.last_t, t)
        handler = getattr(self, f"_on_{kind}", None)
        if handler:
            handler(ev, rank, t)
        if kind not in ("epoch", "message", "run", "step", "gpu", "world", "error"):
            text = describe(ev)
            if kind == "rank" and text:
                # The rank's own word and ddptui's on the same change ("rank 0 done" twice)
                said, self.rank_said[rank] = self.rank_said.get(rank), text
                text = None if text == said else text
            if text:
                self._line(t, "warning" if ev.get("state") in TROUBLE else "info", text,
                           f"rank:{ev.get('state')}" if kind == "rank" else kind)

    def _rank(self, rank: int) -> RankView:
        if rank not in self.ranks:
            self.ranks[rank] = RankView(rank)
        return self.ranks[rank]

    def _on_step(self, ev: schema.StepEvent, rank: int, t: float) -> None:
        r = self._rank(rank)
        if r.state.is_coming:
            r.state = RankState.RUNNING
        r.epoch, r.step = ev.get("epoch", r.epoch), ev.get("step", r.step)
        r.global_step = ev.get("global_step", r.global_step)
        if ev.get("loss") is not None:
            r.loss = ev["loss"]
        r.samples_per_s = ev.get("samples_per_s", 0.0)
        r.step_ms = ev.get("step_ms", 0.0)
        r.data_wait = ev.get("data_wait", 0.0)
        r.progress = ev.get("progress", r.progress)
        r.iteration = ev.get("iteration", False)
        r.steps_per_s = ev.get("steps_per_s", r.steps_per_s)
        r.last_step_t = t
        if self.first_step_t is None:
            self.first_step_t = t
            if self.started_t:
                self._line(t, "info", f"first step {t - self.started_t:.1f} s after launch")
        if self.status == "starting":
            self.status = "running"
        if r.step_ms:
            r.step_times.append(r.step_ms)
        if r.loss is not None:
            self.loss_lines.setdefault(rank, Timeline()).add(t, r.loss)
        stepping = [v for v in self.ranks.values() if v.state.is_stepping]
        if rank == min((v.rank for v in stepping), default=rank):  # one point per interval
            rate = self._throughput(t)
            if ev.get("source") != "output":  # a loss read from output says nothing of rates
                self.rate_line.add(t, rate)
                self.wait_line.add(t, 100 * sum(v.data_wait for v in stepping) /
                                   max(1, len(stepping)))
            self.live_epoch.step(r.epoch, r.step, r.loss, r.progress, r.data_wait, t, rate,
                                 r.steps_per_s if r.iteration else None)

    def _on_gpu(self, ev: schema.GpuEvent, rank: int, t: float) -> None:
        key = f"gpu{ev['gpu']}" if ev.get("util") is not None else f"rank{rank}"
        if ev.get("node") and ev.get("util") is not None:  # attach: GPU numbers repeat per node
            key = f"{ev['node']} {key}"
        d = self.devices.get(key) or self.devices.setdefault(key, DeviceView(key, rank))
        d.rank, d.seen_t = rank, t
        for name in ("util", "mem_used", "mem_total", "power_w", "temp_c", "cpu_percent", "rss",
                     "sm_clock", "mem_clock", "held_down", "others", "pcie_tx", "pcie_rx",
                     "nvlink_tx", "nvlink_rx"):
            if name in ev:
                setattr(d, name, ev[name])
        mem = 100 * d.mem_used / d.mem_total if d.mem_used is not None and d.mem_total else None
        d.history.add(t, d.util if d.util is not None else d.cpu_percent, mem, d.power_w)

    def _on_epoch(self, ev: schema.EpochEvent, rank: int, t: float) -> None:
        restart = self.meta.get("restart", 0)
        key = (restart, ev["epoch"], ev.get("start_step", 0))
        row = self.epochs.setdefault(key, EpochRow(ev["epoch"], ev.get("start_step", 0), restart))
        row.ranks[rank] = ev
        if ev.get("val_acc") is not None:
            self.best_val_acc = max(self.best_val_acc or 0.0, ev["val_acc"])
        # The settings a segment ran under, not those in force: a peer's row cut by `a` arrives
        # after rank 0's "applied". Only a view that has seen no settings event takes them.
        if ev.get("settings") and not self.settings:
            self.settings = dict(ev["settings"])
        self.live_epoch.ended(ev, t)
        live = [r for r in self.ranks.values()
                if r.state.is_member or r.state == RankState.STARTING]
        # Said once every member has sent its row; ranks that ended meanwhile (a script's
        # last epoch: rank 0 done before rank 1's row came) are not waited for.
        if not row.said and (len(row.ranks) >= max(1, len(live))
                             or len(row.ranks) == ev.get("world_size")):
            row.said = True
            self._line(t, "info", describe({"kind": "epoch", "rank": PARENT, **self._merged(row)}))

    def _on_settings(self, ev: schema.SettingsEvent, rank: int, t: float) -> None:
        status, request = ev.get("status"), ev.get("request")
        if status == "requested":
            if request:
                self.asked[request] = ev["settings"]
            self._want(ev["settings"])
        elif status == "pending":
            # Rank 0's echo of one request. Keys pressed since are newer than its word
            # (W W: the echo of the first would undo the second).
            if request in self.asked:
                ids = list(self.asked)
                self.asked = {rid: self.asked[rid] for rid in ids[ids.index(request) + 1:]}
                if self.asked:
                    return
            self._want(ev["settings"])
        else:
            if self.settings and ev["settings"] != self.settings:
                changed = [k for k, v in ev["settings"].items() if self.settings.get(k) != v]
                self.marks.append((t, ", ".join(changed)))
            self.settings, self.pending = dict(ev["settings"]), {}
            for later in self.asked.values():  # not echoed yet: asked after what was applied
                self._want(later)

    def _want(self, settings: dict) -> None:
        wanted = {**self.pending, **settings}
        self.pending = {k: v for k, v in wanted.items() if self.settings.get(k) != v}

    def _on_rank(self, ev: schema.RankEvent, rank: int, t: float) -> None:
        r = self._rank(rank)
        state = RankState.of(ev.get("state", r.state))
        if self.status == "starting" and (state in (RankState.STALLED, RankState.WAITING) or
                                          state == RankState.RUNNING and self.meta.get("script")):
            self.status = "running"  # as its rows say (the built-in loop's: its first step)
        if state != r.state:
            r.state, r.state_t = state, t
            r.reason = ""
        standby = ev.get("standby") or ""
        if standby != r.standby:
            r.standby, r.standby_t = standby, t
        for name in ("pid", "device", "gpu", "host", "reason"):
            if ev.get(name) is not None:
                setattr(r, name, plain(ev[name]) if isinstance(ev[name], str) else ev[name])
        if ev.get("node"):
            r.host = r.node = ev["node"]

    def _on_world(self, ev: schema.WorldEvent, rank: int, t: float) -> None:
        self.meta["world_size"] = ev.get("size")
        if ev.get("generation"):  # a change (generation 0 is the launch)
            self.marks.append((t, f"world {ev.get('size')}"))
            self.pause_asked = None  # the new world agreed its state; a lost order stays lost
            where = f" at epoch {ev['epoch']} step {ev['step']}" if "epoch" in ev else ""
            size = ev.get("size")
            self._line(t, "info", f"world: {count(size, 'rank')} "
                       f"{ev.get('ranks')}{where}")

    def _on_run(self, ev: schema.RunEvent, rank: int, t: float) -> None:
        status = ev.get("status")
        if status == "started" and ev.get("restart") and self.started_t:
            # A script's group started again: one timeline, with a mark where it restarted.
            self.ended_t, self.exit_code, self.reason = None, None, ""
            self.marks.append((t, f"restart {ev['restart']}"))
            self.meta["restart"] = ev["restart"]
            self.status = "starting"
        elif status == "started":
            self.started_t = t
            self.meta.update({k: v for k, v in ev.items() if k not in ("t", "kind", "rank")})
            self.status = "starting"
        elif status in ("pausing", "resuming"):  # asked for; the ranks' word comes later
            self.pause_asked = status == "pausing"
        elif status in ("paused", "resumed"):
            self.paused = status == "paused"
            if self.pause_asked == self.paused:
                self.pause_asked = None
            if rank in self.ranks and ev.get("global_step") is not None:
                self.ranks[rank].global_step = ev["global_step"]  # exact, unlike the sampled steps
            if rank in (0, PARENT):
                self._line(t, "info", describe(ev))
        elif status in ("done", "failed", "interrupted"):
            self.status, self.ended_t = status, t
            for r in self.ranks.values():  # standbys end with the run
                r.standby = ""
            self.exit_code = ev.get("exit_code")
            self.reason = ev.get("reason", "")
            self._line(t, "error" if status == "failed" else "info",
                       f"run {status}" + (f": {self.reason}" if self.reason else ""), "run")

    def _on_message(self, ev: schema.MessageEvent, rank: int, t: float) -> None:
        for name in ("steps_per_epoch", "num_train", "num_classes", "params", "epochs"):
            if name in ev:
                self.meta[name] = ev[name]
        if ev.get("stacks_of") is not None:
            r = self._rank(ev["stacks_of"])
            r.stacks, r.stacks_t = ev.get("stacks") or "", t
        self._line(t, ev.get("level", "info"), describe(ev))

    def _on_output(self, ev: schema.OutputEvent, rank: int, t: float) -> None:
        # Colours kept for the screen; nothing else of a rank's bytes reaches the terminal.
        line = keep_colours(ev.get("text") or "").replace("\r", "").replace("\n", " ")
        self._rank(rank).last_line = line

    def _on_process(self, ev: schema.ProcessEvent, rank: int, t: float) -> None:
        r = self._rank(rank)
        r.status, r.cpu_percent = ev.get("status", ""), ev.get("cpu_percent")
        r.rss, r.gpu_mem = ev.get("rss"), ev.get("gpu_mem")

    def _on_error(self, ev: schema.ErrorEvent, rank: int, t: float) -> None:
        self._rank(rank).error = [plain(str(line)) for line in ev.get("traceback") or []]
        self._line(t, "error", describe(ev), "error")

    def _on_checkpoint(self, ev: schema.CheckpointEvent, rank: int, t: float) -> None:
        self.checkpoint_t = t

    def _throughput(self, now: float) -> float:
        """The members' latest rates while they are fresh: a rank's figure counts for a few of
        its own steps (a 1.4 s step is not 0 img/s), never after its steps stopped coming."""
        return sum(r.samples_per_s for r in self.ranks.values()
                   if r.state.is_stepping and now - r.last_step_t < _fresh_for(r))

    def set_host(self, host: dict) -> None:
        with self.lock:
            self.host = host
            if self.listener:
                self.listener({"type": "host", "host": host})

    # -- reading -------------------------------------------------------------------------
    def view(self) -> RunView:
        """A consistent copy of what the screens draw (taken under the lock)."""
        with self.lock:
            now = self._now()
            return RunView(
                **vars(self._vitals()),
                meta=dict(self.meta),
                elapsed=(now - self.started_t) if self.started_t else 0.0,
                now=now,
                # step_times copied: the supervisor thread appends to the original.
                ranks=[replace(r, step_times=deque(r.step_times))
                       for r in sorted(self.ranks.values(), key=RankView.order)],
                devices=[self._copy_device(d, now)
                         for d in sorted(self.devices.values(), key=DeviceView.order)],
                epochs=[self._merged(self.epochs[k]) for k in sorted(self.epochs)],
                live_epoch=None if self.ended_t is not None else self.live_epoch.row(
                    now, self.settings, self.meta.get("world_size")),
                best_val_acc=self.best_val_acc,
                progress=self._progress(),
                exit_code=self.exit_code,
                reason=self.reason,
                checkpoint_t=self.checkpoint_t,
                host=dict(self.host),
            )

    def charts(self) -> dict:
        """The run's series for the charts: loss per rank, img/s, input wait, change marks, with
        times in seconds since launch (copied under the lock; asked for about once a second)."""
        with self.lock:
            t0 = self.started_t or self.first_step_t or 0.0

            def rel(points):
                # A point before the launch (a node's clock behind ours) would stretch a line
                # far off the chart, and plotext draws every cell of it.
                return [(t - t0, v) for t, v in points if t >= t0]

            return {"loss": {rank: rel(line.copy()) for rank, line in sorted(self.loss_lines.items())},
                    "rate": rel(self.rate_line.copy()), "wait": rel(self.wait_line.copy()),
                    "marks": [(t - t0, label) for t, label in self.marks],
                    "script": bool(self.meta.get("script")),
                    "now": self._now() - t0 if t0 else 0.0}

    def unanswered(self) -> dict[str, dict]:
        """Settings requests rank 0 has not answered yet, by id, oldest first."""
        with self.lock:
            return dict(self.asked)

    def vitals(self) -> Vitals:
        """The few live figures a controller polls often (view() copies the histories)."""
        with self.lock:
            return self._vitals()

    def _vitals(self) -> Vitals:
        return Vitals(status=self.status, paused=self.paused, pause_asked=self.pause_asked,
                     settings=dict(self.settings), pending=dict(self.pending),
                     throughput=self._throughput(self._now()) if self.status == "running"
                     else 0.0)

    def _now(self) -> float:
        return self.ended_t or (time.time() if self.live else self.last_t)

    def lines_after(self, seq: int) -> list[tuple[int, float, str, str, str]]:
        with self.lock:
            return [line for line in self.lines if line[0] > seq]

    def _copy_device(self, d: DeviceView, now: float) -> DeviceView:
        # A finished run's last readings (a GPU at 100%) must not read as the present.
        return replace(d, history=d.history.copy(), age=max(0.0, now - d.seen_t),
                       stale=self.ended_t is not None or now - d.seen_t > STALE_S)

    def _merged(self, row: EpochRow) -> dict:
        """An epoch row as every screen, line and CSV shows it."""
        merged = row.merged()
        if self.meta.get("device_kind") == "cpu" and merged["settings"]:
            # The prefetcher is a CUDA side stream: CPU ranks load batches directly.
            merged["settings"] = {**merged["settings"], "prefetch": "n/a"}
        return merged

    def _progress(self) -> Progress:
        """Epoch, step and the fraction of the run done, from the
        member furthest on; the fraction comes from the ranks' own sampler, so it stays right
        when a smaller world takes more steps per epoch."""
        ranks = list(self.ranks.values())
        r = max(ranks, key=lambda r: (r.global_step, -r.rank)) if ranks else RankView(0)
        epochs = int(self.meta.get("epochs") or 0)
        done = min(1.0, (r.epoch + min(r.progress, 1.0)) / epochs) if epochs else 0.0
        if self.status == "done":
            done = 1.0
        return Progress(r.epoch, epochs, r.step, int(self.meta.get("steps_per_epoch") or 0), done)

