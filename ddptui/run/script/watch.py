"""What the parent sees of a script's ranks from outside, turned into events: their output
(the last line, figures read from it), their processes (state, CPU, memory, GPU memory), stall
verdicts, input that holds them back (run.loader's wait), and their Python stacks on request.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ddptui.contract.gpu import ProcessTree
from ddptui.contract.observe.flight import FlightDumps, behind, compact, summary
from ddptui.contract.observe.metrics import MetricReader, compile_metrics
from ddptui.contract.observe.output import LINE_EVERY_S, library_log
from ddptui.contract.observe.stacks import NO_HANDLER, StackRequests, no_stacks, stacks_said
from ddptui.contract.observe.vitals import read_phases, read_vitals
from ddptui.contract.options.script import ScriptConfig
from ddptui.contract.protocol.events import (
    PARENT,
    Epoch,
    Event,
    Output,
    Process,
    Rank,
    Settings,
    Stacks,
    Step,
)
from ddptui.contract.safe_text import plain
from ddptui.contract.stalls.scripts import Reading, ScriptStalls, Silence, blame
from ddptui.contract.states import RankState
from ddptui.run.inputwatch import InputWatch, Pipeline
from ddptui.run.script.group import ScriptRank

# A script that prints this many lines, or goes on this long, with no loss among them is told
# how to show one, rather than left with an empty chart.
NO_LOSS_LINES, NO_LOSS_S = 50, 30.0
NO_LOSS = ("no loss read from the ranks' output yet: print it as `loss: 0.12` (each rank that "
           "prints is charted), name your figure with --metric loss=REGEX, or add run = "
           "ddptui.init() and run.step(loss) (README: Your own script)")


class ScriptWatch:
    """Owned by the script's run thread: every call comes from it."""

    def __init__(self, config: ScriptConfig, handle: Callable[[Event], None],
                 say: Callable[..., None], trace_prefix: str | None = None):
        self.config, self.handle, self.say = config, handle, say
        self.patterns = compile_metrics(config.metrics)
        self.stalls = ScriptStalls(config.stall_after)
        self.inputs = InputWatch()
        self.stacks = StackRequests()
        # GPU ranks' NCCL flight recorders, dumped with their stacks (ddptui/contract/observe/flight.py)
        self.flight = FlightDumps(trace_prefix) if trace_prefix and config.gpus else None
        self._stacks: dict[int, str] = {}  # slot -> its last Python stacks
        self.tree = ProcessTree()
        self.readers: dict[int, MetricReader] = {}
        self.silence: dict[int, Silence] = {}
        self.flags: dict[int, str] = {}  # slot -> stalled | waiting
        self.flagged_at: dict[int, float] = {}  # a flagged slot -> when the verdict came
        self.evidence: dict[int, str] = {}  # a flagged slot -> its stacks since the verdict
        self.traces: dict[int, dict] = {}  # a flagged slot -> its NCCL dump since the verdict
        self.frozen: set[int] = set()  # flagged slots whose process is stopped
        self._ranks: list[ScriptRank] = []  # the live ranks of the last sample
        self.reporting: set[int] = set()  # slots that send their own steps (ddptui.init)
        self.vitals: dict[int, tuple[int, int]] = {}  # slot -> (optimizer steps, moves) last read
        self.clocked: dict[int, float] = {}  # slot -> its step clock's last window's time
        self._line: dict[int, tuple[str, bool]] = {}  # slot -> latest line not yet sent
        self._line_t: dict[int, float] = {}
        self._lines = 0  # the script's own lines read (not torch's logging)
        self._started = 0.0
        self._told_no_loss = False
        self._told_one_gpu = False
        self._one_gpu_seen: int | None = None  # the last sample's verdict: said when it holds

    def attempt(self, slots: list[int], now: float, standby: bool = False) -> None:
        """A new start of the group (or of a slot's standby): nothing of the last one's output
        or verdicts counts."""
        for slot in slots:
            self.readers[slot] = MetricReader(slot, self.patterns, self.handle)
            self.silence[slot] = Silence(now, announce=not standby)
            self.stalls.forget(slot)
            self._forget(slot)
            self.vitals.pop(slot, None)
        self.reporting -= set(slots)
        self.inputs.fresh(slots)
        if not standby:
            self._started = now
            self._told_one_gpu = False

    # -- what the ranks say --------------------------------------------------------------
    def line(self, slot: int, text: str, final: bool, now: float) -> None:
        """`text`: with its colours (the screen shows them); figures are read from it plain."""
        bare = plain(text)
        if not library_log(bare):  # torch's and NCCL's logs say nothing of the script's pace
            self._heard(slot, now)
            self._lines += final
        if slot not in self.reporting:
            self.readers[slot].line(bare, final)
        self._line[slot] = (text, final)

    def reported(self, ev: Event, now: float) -> None:
        """An event a rank sent itself: it speaks for its own steps from now on."""
        slot = ev.rank
        if slot in self.silence and (isinstance(ev, (Step, Epoch)) or
                                     isinstance(ev, Rank) and ev.api):
            self._heard(slot, now)
            self.reporting.add(slot)
        if isinstance(ev, Step):
            self.inputs.observe(ev)
        elif isinstance(ev, Settings) and ev.status == "applied":
            self.inputs.fresh(list(self.silence))  # run.loader starts its workers again

    def _heard(self, slot: int, now: float) -> None:
        """A line or a step: the first one says the rank runs (its script got going)."""
        silence = self.silence[slot]
        if silence.last is None and silence.announce and slot not in self.flags:
            self.handle(Rank(rank=slot, state=RankState.RUNNING))
        silence.heard(now)

    def _alive(self, r: ScriptRank, now: float) -> None:
        """The rank's signs of life that need no output: an optimizer step is as good as a line;
        its main thread moving on keeps a rank that has said something going (before that it may
        be importing, and then wait in the rendezvous for a slower peer)."""
        vitals = read_vitals(r.vitals_path)
        if vitals is None or vitals == self.vitals.get(r.slot, (0, 0)):
            return
        steps, _ = self.vitals.get(r.slot, (0, 0))
        self.vitals[r.slot] = vitals
        if vitals[0] > steps or self.silence[r.slot].last is not None:
            self._heard(r.slot, now)

    def phases(self, r: ScriptRank) -> None:
        """The newest window of the rank's step clock, from its record, unless it sends its own
        (ddptui.init): while it runs, and once more as it ends (its last window)."""
        if r.slot in self.reporting:
            return
        for ev in read_phases(r.phases_path):
            if ev.t > self.clocked.get(r.slot, 0.0):
                self.clocked[r.slot] = ev.t
                self.handle(ev.replace(rank=r.slot))

    def flush_lines(self, now: float, force: bool = False) -> None:
        """Each rank's latest line as an `output` event, at most every LINE_EVERY_S, and the
        losses read but not yet sent as a step event."""
        for slot, reader in self.readers.items():
            if slot not in self.reporting:
                reader.flush(force)
        for slot, (text, final) in list(self._line.items()):
            if force or now - self._line_t.get(slot, 0.0) >= LINE_EVERY_S:
                self.handle(Output(rank=slot, text=text, final=final))
                self._line_t[slot] = now
                del self._line[slot]
        if not self._told_no_loss and not self.reporting and self._lines and (
                self._lines >= NO_LOSS_LINES or now - self._started >= NO_LOSS_S) and \
                not any(r.points for r in self.readers.values()):
            self._told_no_loss = True
            self.say(NO_LOSS, "info")

    def finished(self, slot: int, whole: bool, pid: int) -> None:
        """The rank's process ended: its last epoch read so far becomes a row (`whole` when
        it exited 0; else the part of the epoch it got through); its readings are over."""
        self.handle(Process(rank=slot, pid=pid, status="exited", cpu_percent=None, rss=None))
        reader = self.readers.get(slot)
        if reader is not None and slot not in self.reporting:
            reader.finish_epoch(partial=not whole)
        self.stalls.forget(slot)
        self._forget(slot)

    def _forget(self, slot: int) -> None:
        """A verdict on `slot` and its evidence are over."""
        self.flags.pop(slot, None)
        self.flagged_at.pop(slot, None)
        self.evidence.pop(slot, None)
        self.traces.pop(slot, None)
        self.frozen.discard(slot)

    # -- what the parent sees ------------------------------------------------------------
    def sample(self, ranks: list[ScriptRank], gpu_util: dict[int, float],
               gpu_memory: dict[int, int], now: float, judge: bool = True,
               settings: dict | None = None, gpus_of: dict[int, set[int]] | None = None) -> None:
        """Process figures of every live rank, and (`judge`: not while the group is being
        ended) a stall verdict where one is due, or else whether run.loader's input (its
        `settings` in force) holds the ranks back; whether ranks given GPUs of their own all
        run on one (`gpus_of`: pid -> the GPUs it holds memory on)."""
        self._ranks = ranks
        for r in ranks:
            cpu, rss = self.tree.read(r.pid)
            p = self.tree.process(r.pid)
            try:
                status = p.status() if p is not None else "gone"
            except Exception:  # psutil.Error: ended between two calls
                status = "gone"
            mem = sum(gpu_memory.get(pid, 0) for pid in {r.pid} | r.children)
            self._alive(r, now)
            self.phases(r)
            vitals = self.vitals.get(r.slot)
            self.handle(Process(rank=r.slot, pid=r.pid, status=status, cpu_percent=cpu, rss=rss,
                                gpu_mem=mem if r.gpu is not None else None,
                                opt_steps=vitals[0] if vitals else None,
                                moves=vitals[1] if vitals else None))
            s = self.silence[r.slot]
            if not judge:
                continue
            verdict = self.stalls.judge(Reading(r.slot, status, cpu, gpu_util.get(r.gpu)
                                                if r.gpu is not None else None, s.last,
                                                s.longest), now)
            self._update(r, verdict, now)
        self.tree.forget()
        if judge and gpus_of and not self._told_one_gpu:
            self._one_gpu(ranks, gpus_of)
        if judge and ranks and not self.flags and settings and "workers" in settings:
            self._input(ranks, settings)

    def _one_gpu(self, ranks: list[ScriptRank], gpus_of: dict[int, set[int]]) -> None:
        """Said once an attempt, when two samples in a row agree (not a context a rank made on
        the first GPU as it started): every rank on one GPU though each was given its own."""
        gpu = one_gpu({r.slot: set().union(*(gpus_of.get(p, set()) for p in {r.pid} | r.children))
                       for r in ranks if r.gpu is not None})
        seen, self._one_gpu_seen = self._one_gpu_seen, gpu
        if gpu is None or gpu != seen:
            return
        self._told_one_gpu = True
        self.say(f"ranks {', '.join(str(r.slot) for r in ranks)} all run on GPU {gpu}, though "
                 "each was given its own (LOCAL_RANK k is the k-th of --gpus): the script "
                 "picks its device otherwise (a --local_rank default, cuda:0, a fixed "
                 "torch.cuda.set_device)", "warning")

    def _input(self, ranks: list[ScriptRank], settings: dict) -> None:
        pipeline = Pipeline(cuda=bool(self.config.gpus), decode="cpu", files=False,
                            workers=int(settings["workers"]),
                            prefetch=bool(settings.get("prefetch", True)), ranks=len(ranks),
                            cores=os.cpu_count() or 1)
        said = self.inputs.check([r.slot for r in ranks], pipeline)
        if said:
            self.handle(said)

    def _update(self, r: ScriptRank, verdict, now: float) -> None:
        if r.slot in self.flags:  # stalled, or found waiting in a collective
            # Only the rank's own progress ends a verdict: a step, or a line of its own since.
            # Its CPU or output while it answers ddptui's requests (stacks, NCCL dumps) is none.
            heard = self.silence[r.slot].last
            if heard is not None and heard > self.flagged_at[r.slot]:
                self._forget(r.slot)
                self._rank(r, RankState.RUNNING, "making progress again")
            return
        if verdict is None:
            return
        reason, fields = verdict
        self.flags[r.slot] = RankState.STALLED
        self.flagged_at[r.slot] = now
        if fields.get("cause") == "stopped":
            self.frozen.add(r.slot)
            self._blame({x.slot: x for x in self._ranks})
        self._rank(r, RankState.STALLED, reason, **fields)
        self.ask_stacks(r, now)

    def _rank(self, r: ScriptRank, state: str, reason: str, **fields) -> None:
        self.handle(Rank(rank=r.slot, state=state, pid=r.pid, gpu=r.gpu, reason=reason, **fields))

    def ask_stacks(self, r: ScriptRank, now: float) -> None:
        if not os.path.exists(r.stacks_path):
            self.handle(no_stacks(r.slot, "it has not loaded ddptui's sitecustomize (still "
                                          "starting, or run with python -S / -I)"))
            return
        if not self.stacks.ask(r.slot, r.pid, r.stacks_path, now, self.config.stacks_signal):
            self.handle(no_stacks(r.slot, NO_HANDLER))
        if self.flight is not None:
            self.flight.ask(r.slot, now)

    def collect_stacks(self, ranks: dict[int, ScriptRank], now: float) -> None:
        for slot, text in self.stacks.collect(now):
            stalled = self.flags.get(slot) == RankState.STALLED
            self._stacks[slot] = text or ""
            self.handle(stacks_said(slot, text, stalled))
            if stalled and text is not None:
                self.evidence[slot] = text
                self._blame(ranks)
        for slot, trace in self.flight.collect(now) if self.flight is not None else []:
            nccl = summary(trace)
            if nccl is None:
                continue
            stacks = self._stacks.get(slot, "")  # the stacks screen shows it above them
            self.handle(Stacks(rank=PARENT, level="info", text=f"rank {slot}: {nccl}",
                               stacks_of=slot, stacks=f"{nccl}\n\n{stacks}" if stacks else nccl))
            if slot in self.flags:
                self.traces[slot] = compact(trace)
                self._blame(ranks)

    def _blame(self, ranks: dict[int, ScriptRank]) -> None:
        """Stalled ranks blocked in a collective while another is stuck in its own code (or
        frozen: stopped, no stacks to take) wait for that one: they are shown `waiting`, the
        other stays `stalled`. The NCCL dumps say it best where they name a rank that never
        joined the collective the others are in (DDP's all-reduce runs behind the Python)."""
        found = blame(self.evidence, self.frozen)
        found.update(behind(self.traces))
        for slot, (where, culprits) in found.items():
            if self.flags.get(slot) == RankState.STALLED and slot in ranks:
                self.flags[slot] = RankState.WAITING
                names = ", ".join(map(str, culprits))
                self._rank(ranks[slot], RankState.WAITING, f"in {where}: waiting for rank {names}",
                           phase=where, waiting_for=culprits)


def one_gpu(held: dict[int, set[int]]) -> int | None:
    """The one GPU that every rank (slot -> the GPUs its processes hold memory on) runs on,
    where there are several ranks and each holds memory on that GPU alone; else None."""
    gpus = set().union(*held.values()) if held else set()
    if len(held) < 2 or len(gpus) != 1 or not all(held.values()):
        return None
    return next(iter(gpus))
