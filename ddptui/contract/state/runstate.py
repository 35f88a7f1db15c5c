"""The run state: everything the dashboard and the headless console show, folded from events.

Fed by the supervisor thread (live) or by a replayed log; readers take `view()` under the lock.
Pure Python: no torch, no NVML, no psutil here.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable

from ddptui.contract.protocol.events import (
    PARENT,
    Checkpoint,
    Epoch,
    Error,
    Event,
    Facts,
    Gpu,
    Notice,
    Output,
    Process,
    Rank,
    Run,
    Settings,
    Stacks,
    Step,
    World,
)
from ddptui.contract.protocol.updates import Applied, HostReadings, Said, Update
from ddptui.contract.safe_text import keep_colours, plain
from ddptui.contract.state.copies import Copies
from ddptui.contract.state.epochs import EpochRow, LiveEpoch
from ddptui.contract.state.steptime import StepTimes
from ddptui.contract.state.timeline import MANY, LossBand, Timeline, chart_series
from ddptui.contract.state.views import DeviceView, RankView, RunView, Vitals, progress_of, throughput
from ddptui.contract.states import RankState
from ddptui.contract.wording import count, describe, epoch_line

# rank states the event pane shows as warnings
TROUBLE = frozenset({RankState.STALLED, RankState.CRASHED, RankState.SLOW})


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
        self._lead = -1  # the rank whose steps make the charts' points
        self.ended_t: float | None = None
        self.ranks: dict[int, RankView] = {}
        self.devices: dict[str, DeviceView] = {}
        # Views copy anew only what events touched (a handler changing other rows touches them)
        self.rank_copies, self.device_copies = Copies(RankView.order), Copies(DeviceView.order)
        self.epochs: dict[tuple[int, int, int], EpochRow] = {}  # (restart, epoch, step0) -> row
        self.settings: dict = {}
        self.pending: dict = {}
        self.asked: dict[str, dict] = {}  # requests rank 0 has not echoed yet, oldest first
        self.best_val_acc: float | None = None
        self.loss_lines: dict[int, Timeline] = {}  # rank -> its loss, up to MANY ranks
        self.loss_band = LossBand()  # the ranks' lowest, median and highest loss
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
        self.steptimes = StepTimes()  # where each rank's step time goes, and the run's verdict
        # Each change, as the run's viewers take it (ddptui/run/host/host.py), under the lock.
        self.listener: Callable[[Update], None] | None = None

    # -- writing -------------------------------------------------------------------------
    def apply(self, ev: Event) -> None:
        with self.lock:
            self._apply(ev)
            if self.listener:
                self.listener(Applied(ev=ev.fields()))

    def say(self, text: str, level: str = "info", t: float | None = None) -> None:
        with self.lock:
            t = t or time.time()
            self._line(t, level, text)
            if self.listener:
                self.listener(Said(text=text, level=level, t=t))

    def _line(self, t: float, level: str, text: str | None, kind: str = "message") -> None:
        """`kind`: the event the line tells of, `rank:STATE` for a rank's (a console may show
        some kinds only)."""
        self.seq += 1
        # Text from ranks and remote peers: no escape sequence reaches a terminal raw.
        self.lines.append((self.seq, t, level, plain(text or ""), kind))

    def _apply(self, ev: Event) -> None:
        self.last_t = max(self.last_t, ev.t)
        self.steptimes.take(ev)
        self.rank_copies.touch(ev.rank)
        for cls in type(ev).__mro__:  # a kind's own handler, else its base's (a Notice's)
            handler = _HANDLERS.get(cls)
            if handler is not None:
                handler(self, ev)
                break
        if isinstance(ev, (Rank, Settings, Checkpoint)):
            text = describe(ev)
            if isinstance(ev, Rank) and text:
                # The rank's own word and ddptui's on the same change ("rank 0 done" twice)
                said, self.rank_said[ev.rank] = self.rank_said.get(ev.rank), text
                text = None if text == said else text
            if text:
                level = "warning" if isinstance(ev, Rank) and ev.state in TROUBLE else "info"
                self._line(ev.t, level, text, f"rank:{ev.state}" if isinstance(ev, Rank)
                           else ev.NAME)

    def _rank(self, rank: int) -> RankView:
        if rank not in self.ranks:
            self.ranks[rank] = RankView(rank)
            self.rank_copies.touch(rank, moved=True)
            if len(self.ranks) > MANY:  # the chart draws their band
                self.loss_lines.clear()
        return self.ranks[rank]

    def _on_step(self, ev: Step) -> None:
        t, r = ev.t, self._rank(ev.rank)
        if r.state.is_coming:
            r.state = RankState.RUNNING
        r.epoch, r.step, r.global_step = ev.epoch, ev.step, ev.global_step
        if ev.loss is not None:
            r.loss = ev.loss
        r.samples_per_s, r.step_ms = ev.samples_per_s or 0.0, ev.step_ms or 0.0
        r.data_wait = ev.data_wait or 0.0
        r.progress = r.progress if ev.progress is None else ev.progress
        r.iteration = bool(ev.iteration)
        r.steps_per_s = r.steps_per_s if ev.steps_per_s is None else ev.steps_per_s
        r.last_step_t = t
        if self.first_step_t is None:
            self.first_step_t = t
            if self.started_t:
                self._line(t, "info", f"first step {t - self.started_t:.1f} s after launch")
        if self.status == "starting":
            self.status = "running"
        r.stepped(t, r.step_ms)
        if r.step_ms:
            r.step_times.append(r.step_ms)
            r.count(ev.steps or 1, r.step_ms, r.samples_per_s)
        if r.loss is not None and len(self.ranks) <= MANY:
            self.loss_lines.setdefault(ev.rank, Timeline()).add(t, r.loss)
        # One point an interval, from the lowest stepping rank (found anew only when it may move)
        lead = self.ranks.get(self._lead)
        if lead is None or ev.rank < self._lead or not lead.state.is_stepping:
            self._lead = min((v.rank for v in self.ranks.values() if v.state.is_stepping),
                             default=ev.rank)
        if ev.rank == self._lead:
            stepping = [v for v in self.ranks.values() if v.state.is_stepping]
            rate = self._throughput(t)
            if ev.source != "output":  # a loss read from output says nothing of rates
                self.rate_line.add(t, rate)
                self.wait_line.add(t, 100 * sum(v.data_wait for v in stepping) /
                                   max(1, len(stepping)))
            self.loss_band.add(t, [v.loss for v in stepping if v.loss is not None])
            self.live_epoch.step(r.epoch, r.step, r.loss, r.progress, r.data_wait, t, rate,
                                 r.steps_per_s if r.iteration else None)

    def _on_gpu(self, ev: Gpu) -> None:
        key = f"gpu{ev.gpu}" if ev.util is not None else f"rank{ev.rank}"
        if ev.node and ev.util is not None:  # attach: GPU numbers repeat per node
            key = f"{ev.node} {key}"
        d = self.devices.get(key) or self.devices.setdefault(key, DeviceView(key, ev.rank))
        self.device_copies.touch(key)
        d.take(ev)

    def _on_epoch(self, ev: Epoch) -> None:
        restart = self.meta.get("restart", 0)
        key = (restart, ev.epoch, ev.start_step or 0)
        row = self.epochs.setdefault(key, EpochRow(ev.epoch, ev.start_step or 0, restart))
        row.take(ev)
        if ev.val_acc is not None:
            self.best_val_acc = max(self.best_val_acc or 0.0, ev.val_acc)
        # The settings a segment ran under, not those in force: a peer's row cut by `a` arrives
        # after rank 0's "applied". Only a view that has seen no settings event takes them.
        if ev.settings and not self.settings:
            self.settings = dict(ev.settings)
        self.live_epoch.ended(ev, ev.t)
        live = [r for r in self.ranks.values()
                if r.state.is_member or r.state == RankState.STARTING]
        # Said once every member has sent its row; ranks that ended meanwhile (a script's
        # last epoch: rank 0 done before rank 1's row came) are not waited for.
        if not row.said and (row.count >= max(1, len(live)) or row.count == ev.world_size):
            row.said = True
            self._line(ev.t, "info", epoch_line(self._row(row)))

    def _on_settings(self, ev: Settings) -> None:
        if ev.status == "requested":
            if ev.request:
                self.asked[ev.request] = ev.settings
            self._want(ev.settings)
        elif ev.status == "pending":
            # Rank 0's echo of one request. Keys pressed since are newer than its word
            # (W W: the echo of the first would undo the second).
            if ev.request in self.asked:
                ids = list(self.asked)
                self.asked = {rid: self.asked[rid] for rid in ids[ids.index(ev.request) + 1:]}
                if self.asked:
                    return
            self._want(ev.settings)
        else:
            if self.settings and ev.settings != self.settings:
                changed = [k for k, v in ev.settings.items() if self.settings.get(k) != v]
                self.marks.append((ev.t, ", ".join(changed)))
            self.settings, self.pending = dict(ev.settings), {}
            for later in self.asked.values():  # not echoed yet: asked after what was applied
                self._want(later)

    def _want(self, settings: dict) -> None:
        wanted = {**self.pending, **settings}
        self.pending = {k: v for k, v in wanted.items() if self.settings.get(k) != v}

    def _on_rank(self, ev: Rank) -> None:
        r, state = self._rank(ev.rank), RankState.of(ev.state)
        if self.status == "starting" and (state in (RankState.STALLED, RankState.WAITING) or
                                          state == RankState.RUNNING and self.meta.get("script")):
            self.status = "running"  # as its rows say (the built-in loop's: its first step)
        if state != r.state:
            r.state, r.state_t, r.reason = state, ev.t, ""
            r.entered(state, ev.t, ev.reason or "")
        standby = ev.standby if isinstance(ev.standby, str) else ""  # older logs: a bool
        if standby != r.standby:
            r.standby, r.standby_t = standby, ev.t
        for name in ("pid", "device", "gpu", "host", "reason", "local_rank"):
            value = getattr(ev, name)
            if value is not None:
                setattr(r, name, plain(value) if isinstance(value, str) else value)
        if ev.node:
            self.rank_copies.touch(ev.rank, moved=ev.node != r.node)  # rows go node by node
            r.host = r.node = ev.node
        if ev.control is not None:
            r.control = [c for c in ev.control if isinstance(c, str)]

    def _on_world(self, ev: World) -> None:
        self.meta["world_size"] = ev.size
        if ev.generation:  # a change (generation 0 is the launch)
            self.marks.append((ev.t, f"world {ev.size}"))
            self.pause_asked = None  # the new world agreed its state; a lost order stays lost
            where = f" at epoch {ev.epoch} step {ev.step}" if ev.epoch is not None else ""
            self._line(ev.t, "info", f"world: {count(ev.size, 'rank')} {ev.ranks}{where}")

    def _on_run(self, ev: Run) -> None:
        t, status = ev.t, ev.status
        self.rank_copies.touched.update(self.ranks)  # a start or an end changes every row
        if status == "started" and ev.restart and self.started_t:
            # A script's group started again: one timeline, with a mark where it restarted.
            self.ended_t, self.exit_code, self.reason = None, None, ""
            self.marks.append((t, f"restart {ev.restart}"))
            self.meta["restart"] = ev.restart
            self.meta["launcher"] = ev.launcher or self.meta.get("launcher")  # found as it ran
            for r in self.ranks.values():  # the new processes say again what they take
                r.control = []
            self.status = "starting"
        elif status == "started":
            self.started_t = t
            self.meta.update({k: v for k, v in ev.fields().items()
                              if k not in ("t", "kind", "rank", "node", "status")})
            self.status = "starting"
        elif status in ("pausing", "resuming"):  # asked for; the ranks' word comes later
            self.pause_asked = status == "pausing"
        elif status in ("paused", "resumed"):
            self.paused = status == "paused"
            if self.pause_asked == self.paused:
                self.pause_asked = None
            if ev.rank in self.ranks and ev.global_step is not None:
                self.ranks[ev.rank].global_step = ev.global_step  # exact, unlike sampled steps
            if ev.rank in (0, PARENT):
                self._line(t, "info", describe(ev))
        elif status in ("done", "failed", "interrupted"):
            self.status, self.ended_t = status, t
            for r in self.ranks.values():  # standbys end with the run
                r.standby = ""
            self.exit_code, self.reason = ev.exit_code, ev.reason or ""
            self._line(t, "error" if status == "failed" else "info",
                       f"run {status}" + (f": {self.reason}" if self.reason else ""), "run")

    def _on_notice(self, ev: Notice) -> None:
        self._line(ev.t, ev.level, describe(ev))

    def _on_facts(self, ev: Facts) -> None:
        for name in ("steps_per_epoch", "num_train", "num_classes", "params", "epochs"):
            if getattr(ev, name) is not None:
                self.meta[name] = getattr(ev, name)
        self._on_notice(ev)

    def _on_stacks(self, ev: Stacks) -> None:
        r = self._rank(ev.stacks_of)
        self.rank_copies.touch(ev.stacks_of)
        r.stacks, r.stacks_t = ev.stacks, ev.t
        self._on_notice(ev)

    def _on_output(self, ev: Output) -> None:
        # Colours kept for the screen; nothing else of a rank's bytes reaches the terminal.
        line = keep_colours(ev.text).replace("\r", "").replace("\n", " ")
        self._rank(ev.rank).last_line = line

    def _on_process(self, ev: Process) -> None:
        r = self._rank(ev.rank)
        r.status, r.cpu_percent = ev.status, ev.cpu_percent
        r.rss, r.gpu_mem = ev.rss, ev.gpu_mem

    def _on_error(self, ev: Error) -> None:
        self._rank(ev.rank).error = [plain(str(line)) for line in ev.traceback]
        self._line(ev.t, "error", describe(ev), "error")

    def _on_checkpoint(self, ev: Checkpoint) -> None:
        self.checkpoint_t = ev.t

    def _throughput(self, now: float) -> float:
        return throughput(self.ranks.values(), now)

    def set_host(self, host: dict) -> None:
        with self.lock:
            self.host = host
            if self.listener:
                self.listener(HostReadings(host=host))

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
                # Copied: the supervisor thread appends to the originals' histories.
                ranks=self.rank_copies.rows(self.ranks, RankView.copied),
                devices=[d.aged(now, self.ended_t is not None)
                         for d in self.device_copies.rows(self.devices, DeviceView.copied)],
                epochs=[self._row(self.epochs[k]) for k in sorted(self.epochs)],
                live_epoch=None if self.ended_t is not None else self.live_epoch.row(
                    now, self.settings, self.meta.get("world_size")),
                best_val_acc=self.best_val_acc,
                progress=progress_of(list(self.ranks.values()), self.meta, self.status),
                exit_code=self.exit_code,
                reason=self.reason,
                checkpoint_t=self.checkpoint_t,
                host=dict(self.host),
            )

    def charts(self) -> dict:
        """The run's series for the charts, copied under the lock (asked for once a second)."""
        with self.lock:
            return chart_series(self, self._now())

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

    def _row(self, row: EpochRow) -> dict:
        # The prefetcher is a CUDA side stream: CPU ranks load batches directly.
        return row.merged(cpu=self.meta.get("device_kind") == "cpu")

    def _now(self) -> float:
        return self.ended_t or (time.time() if self.live else self.last_t)

    def lines_after(self, seq: int) -> list[tuple[int, float, str, str, str]]:
        with self.lock:
            return [line for line in self.lines if line[0] > seq]


_HANDLERS: dict[type, Callable[..., None]] = {
    Step: RunState._on_step, Gpu: RunState._on_gpu, Epoch: RunState._on_epoch,
    Settings: RunState._on_settings, Rank: RunState._on_rank, World: RunState._on_world,
    Run: RunState._on_run, Notice: RunState._on_notice, Facts: RunState._on_facts,
    Stacks: RunState._on_stacks, Output: RunState._on_output, Process: RunState._on_process,
    Error: RunState._on_error, Checkpoint: RunState._on_checkpoint,
}  # each event class -> what it changes (a Notice's kinds: their line, and what they tell)
