"""Every event a process of a run sends: one frozen dataclass a kind, each field's type and
meaning beside it. They cross the ranks' pipes, the report channel and the dashboards' socket,
and each is one line of the JSONL log (codec.py); docs/events.md is written from them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from ddptui.contract.protocol.wire import Family, Wire, doc, now

PARENT = -1  # an event's rank when ddptui itself says it
EVENTS = Family("kind")

SETTINGS = ("input-pipeline settings by name: prefetch (bool), workers (int), cudnn_benchmark "
            "(bool)")
RankState = Literal["starting", "running", "standby", "stopped", "crashed", "restarting",
                    "stalled", "waiting", "slow", "unreachable", "done"]
Level = Literal["info", "warning", "error"]


@dataclass(frozen=True, kw_only=True, slots=True)
class Event(Wire):
    """What every event carries."""

    t: float = doc("unix time of the event, s", factory=now)
    rank: int = doc("the rank slot it is about (its sender, for a rank's own); -1: the parent, "
                    "ddptui itself")
    node: str | None = doc("the host that sent it, added by a rank under torchrun or srun that "
                           "reports to `ddptui attach`", None)


@EVENTS.register("step")
@dataclass(frozen=True, kw_only=True, slots=True)
class Step(Event):
    """A rank's progress, at most about 20 a second (fewer for slow steps). Sent by each rank;
    for a script, read from its output (`source: output`) or sent by `ddptui.init()`."""

    epoch: int = doc("the epoch, from 0")
    step: int = doc("steps done in this epoch (the epoch's whole world counts one step)")
    global_step: int = doc("steps done since the run began")
    loss: float | None = doc("the mean training loss of the steps since the last step event, "
                             "read with a lag (null: not read yet, or not finite)")
    steps: int | None = doc("steps the figures cover", None)
    samples_per_s: float | None = doc("this rank's samples a second over those steps", None)
    step_ms: float | None = doc("mean wall time of those steps, ms", None)
    data_wait: float | None = doc("share of that time spent waiting for input, 0-1", None)
    progress: float | None = doc("fraction of the epoch done, from the rank's sampler (right in "
                                 "any world size)", None)
    source: Literal["output"] | None = doc("read from the script's output: no rates", None)
    metrics: dict | None = doc("other figures read from the script's output (`--metric`), by "
                               "name", None)
    iteration: bool | None = doc("the script names no epochs (nanoGPT): `step` is its iteration "
                                 "since it began, the epoch stays 0", None)
    steps_per_s: float | None = doc("steps (iterations) a second, read from the steps the "
                                    "script printed (no samples known)", None)


@EVENTS.register("gpu")
@dataclass(frozen=True, kw_only=True, slots=True)
class Gpu(Event):
    """One device's readings, twice a second: a GPU's from NVML (the parent's sampler, or a
    rank's own without a ddptui parent), or a CPU rank's process tree from psutil."""

    gpu: int | None = doc("the GPU's NVML index (null: a CPU rank)")
    util: float | None = doc("GPU utilisation, %", None)
    mem_used: int | None = doc("GPU memory used, MiB (NVML v2: as nvidia-smi)", None)
    mem_total: int | None = doc("GPU memory, MiB", None)
    power_w: float | None = doc("power draw, W", None)
    temp_c: float | None = doc("temperature, degrees C", None)
    sm_clock: int | None = doc("SM clock, MHz", None)
    mem_clock: int | None = doc("memory clock, MHz", None)
    held_down: list | None = doc("NVML clock-event reasons in force (power cap, thermal, ...), "
                                 "by name", None)
    others: list | None = doc("processes on the GPU that are not the run's: [pid, MiB, user, "
                              "name] each", None)
    pcie_tx: float | None = doc("PCIe sent, MB/s (absent where NVML has no counter)", None)
    pcie_rx: float | None = doc("PCIe received, MB/s", None)
    nvlink_tx: float | None = doc("NVLink sent, MB/s", None)
    uuid: str | None = doc("the GPU's UUID as nvidia-smi shows it (GPU-...): in its first "
                           "reading and once a minute after", None)
    nvlink_rx: float | None = doc("NVLink received, MB/s", None)
    cpu_percent: float | None = doc("a CPU rank's process tree (workers too): CPU, % of one "
                                    "core", None)
    rss: int | None = doc("a CPU rank's process tree: resident memory, MiB", None)


@EVENTS.register("epoch")
@dataclass(frozen=True, kw_only=True, slots=True)
class Epoch(Event):
    """The end of an epoch, or of the part of one between two changes (settings applied with
    `a`, a rank leaving or joining, a rollback, a quit). Sent by each rank for its own samples."""

    epoch: int = doc("the epoch, from 0")
    seconds: float = doc("wall time of the segment, s")
    samples: int = doc("samples this rank trained in it")
    samples_per_s: float = doc("this rank's samples a second")
    data_wait: float = doc("share of the time spent waiting for input, 0-1")
    settings: dict = doc("the input-pipeline settings it ran under (see `settings`)")
    train_loss: float | None = doc("mean training loss (none: the segment has no loss read)", None)
    steps: int | None = doc("steps in the segment", None)
    start_step: int | None = doc("the epoch's step it began at (0: the epoch's start)", None)
    end_step: int | None = doc("the epoch's step it ended at", None)
    partial: bool | None = doc("a part of an epoch (a change, a rollback, a quit)", None)
    world_size: int | None = doc("ranks in the world during it", None)
    global_step: int | None = doc("steps done since the run began, at its end", None)
    bad_samples: int | None = doc("corrupt samples skipped in it, by this rank", None)
    val_loss: float | None = doc("validation loss (after a whole epoch)", None)
    val_acc: float | None = doc("validation top-1 accuracy, 0-1", None)
    val_samples: int | None = doc("validation samples scored, all ranks together", None)
    rolled_back: int | None = doc("the segment ended in a rollback that redid this many "
                                  "steps", None)
    at_quit: bool | None = doc("the segment a quit ended", None)
    metrics: dict | None = doc("a script's other figures of the epoch (`--metric`, `run.log`), "
                               "by name", None)
    source: Literal["output"] | None = doc("read from a script's output: no rates, no "
                                           "settings", None)
    at_step: int | None = doc("a script that names no epochs: the row of an evaluation it "
                              "printed at this iteration, over the iterations since the one "
                              "before (`start_step` and `end_step` are it)", None)
    steps_per_s: float | None = doc("steps (iterations) a second over the segment, from the "
                                    "steps a script printed", None)


@EVENTS.register("settings")
@dataclass(frozen=True, kw_only=True, slots=True)
class Settings(Event):
    """The input-pipeline settings: asked for (the parent, `requested`), acknowledged by the
    world's rank 0 (`pending`, until the next epoch or `a`) and put in force on every rank at
    one step (`applied`, sent by rank 0)."""

    settings: dict = doc(SETTINGS)
    status: Literal["requested", "pending", "applied"] | None = doc(
        "where the change is (absent: applied)", None)
    epoch: int | None = doc("the epoch they apply from", None)
    step: int | None = doc("the epoch's step they apply from (applied with `a`)", None)
    request: str | None = doc("the request's id: rank 0's `pending` names the request it "
                              "answers", None)


@EVENTS.register("rank")
@dataclass(frozen=True, kw_only=True, slots=True)
class Rank(Event):
    """A rank slot's state changed, or a detail of it (its standby, a verdict on a stall). Sent
    by the rank itself (running, done), by the parent (what it sees of the process), or by the
    watchdog."""

    state: RankState = doc("the slot's state (docs/dashboard.md: rank states)")
    pid: int | None = doc("its process", None)
    gpu: int | None = doc("its GPU's NVML index (absent: CPU, or not said)", None)
    device: str | None = doc("its torch device, e.g. cuda:0 or cpu", None)
    host: str | None = doc("its host name", None)
    reason: str | None = doc("why it is in this state (a crash's cause, a stall's verdict)", None)
    exit_code: int | None = doc("its process's exit code, once it ended", None)
    standby: str | bool | None = doc(
        "out of the world: its warm standby is `warming` or `ready`; a script's joiner "
        "(restarting) is `preparing` (its script runs up to run.elastic() while the others "
        "train) or `prepared` (they form the world with it now)", None)
    world_rank: int | None = doc("its rank in the world it entered", None)
    api: str | None = doc("a script rank that called `ddptui.init()`: ddptui.init; one under "
                          "`python -m ddptui.wrap`: ddptui.rank.wrap", None)
    control: list | None = doc("the orders that script rank takes (pause, checkpoint, stop, "
                               "settings, elastic)", None)
    alone: bool | None = doc("that script rank has no process group: it takes the dashboard's "
                             "orders itself, not agreed at one step", None)
    local_rank: int | None = doc("a rank under `python -m ddptui.wrap`: its LOCAL_RANK on its "
                                 "node", None)
    seconds: float | None = doc("stalled or waiting: seconds since its last step", None)
    process: str | None = doc("stalled: its process state (running, sleeping, stopped, disk "
                              "wait, zombie)", None)
    cpu_percent: float | None = doc("stalled: its CPU, %", None)
    gpu_activity: str | None = doc("stalled: its GPU busy or idle", None)
    phase: str | None = doc("stalled: where its loop is (its last heartbeat)", None)
    global_step: int | None = doc("stalled: the step it last reported", None)
    waiting_for: list | None = doc("waiting: the stalled ranks it waits for", None)
    cause: str | None = doc("slow: the likely cause (data-wait, clocks, shared GPU, compute); "
                            "stalled: stopped, idle or silent", None)
    slower: float | None = doc("slow: how much slower than the others' median, 0-1", None)


@EVENTS.register("world")
@dataclass(frozen=True, kw_only=True, slots=True)
class World(Event):
    """The world formed, or changed (a rank left, joined, or died and the rest re-formed)."""

    size: int = doc("ranks in it")
    ranks: list = doc("the slots in it, in world-rank order")
    generation: int | None = doc("how many times it has formed, from 0", None)
    epoch: int | None = doc("where it goes on from: the epoch", None)
    step: int | None = doc("... and the epoch's step", None)
    global_step: int | None = doc("steps done since the run began", None)
    base_lr: float | None = doc("the learning rate after scaling to the new size", None)


@EVENTS.register("run")
@dataclass(frozen=True, kw_only=True, slots=True)
class Run(Event):
    """The run as a whole: started, paused, resumed, ended. The parent says started and how it
    ended; rank 0 says paused and resumed, at the step every rank holds at."""

    status: Literal["started", "done", "failed", "interrupted", "paused", "resumed", "pausing",
                    "resuming"] = doc("pausing and resuming: asked for, not there yet (the "
                                      "parent's own)")
    exit_code: int | None = doc("how ddptui exits (0 done, 1 failed, 2 bad input, 130 "
                                "interrupted, 143 SIGTERM)", None)
    reason: str | None = doc("why it failed or stopped", None)
    seconds: float | None = doc("how long it ran, s", None)
    global_step: int | None = doc("paused or resumed: the step every rank holds at", None)
    best_val_acc: float | None = doc("the best validation accuracy seen", None)
    pid: int | None = doc("started: ddptui's process", None)
    model: str | None = doc("started: the model, or the script's label", None)
    data: str | None = doc("started: the data", None)
    epochs: int | None = doc("started: epochs to train (0: the script knows)", None)
    world_size: int | None = doc("started: ranks", None)
    device_kind: str | None = doc("started: cuda or cpu", None)
    gpus: list | None = doc("started: the GPUs, by NVML index", None)
    batch_size: int | None = doc("started: per rank", None)
    log: str | None = doc("started: this log's path", None)
    checkpoint_dir: str | None = doc("started: where checkpoints go", None)
    script: str | None = doc("your own script's run: its command line", None)
    restart: int | None = doc("a script's run: which start of its ranks, from 0", None)
    launcher: str | None = doc("a script's run: the script starts its own ranks (mp.spawn, "
                               "Lightning's ddp_spawn), as ddptui says it", None)
    restarting: bool | None = doc("a script attempt that ended: its ranks start again", None)


@EVENTS.register("message")
@dataclass(frozen=True, kw_only=True, slots=True)
class Notice(Event):
    """A line for the event pane and the headless console: progress, warnings, errors. The
    kinds below are lines too, each with the facts it tells beside its text."""

    level: Level = doc("how it is shown")
    text: str = doc("the line")


@EVENTS.register("stacks")
@dataclass(frozen=True, kw_only=True, slots=True)
class Stacks(Notice):
    """A rank's Python stacks (every thread, as faulthandler prints them), or why none came;
    on GPUs, its NCCL flight recorder's summary."""

    stacks_of: int = doc("the rank whose stacks these are")
    stacks: str = doc("every thread's stack ('' when none came)")
    flight: dict | None = doc("a wrapped rank's NCCL flight recorder, compact: its summary, the "
                              "last collective each process group enqueued, the oldest still "
                              "open", None)


@EVENTS.register("facts")
@dataclass(frozen=True, kw_only=True, slots=True)
class Facts(Notice):
    """What a rank found out about its run as it set up: the data, the model, the epochs."""

    num_classes: int | None = doc("the data's classes", None)
    num_train: int | None = doc("training samples", None)
    steps_per_epoch: int | None = doc("steps in an epoch of the whole world", None)
    params: int | None = doc("the model's parameters", None)
    epochs: int | None = doc("the epochs the run trains, where a script says so "
                             "(`run.epochs(n)`)", None)
    world_size: int | None = doc("ranks in the world", None)
    global_step: int | None = doc("steps done since the run began", None)
    decoder: str | None = doc("--decode gpu: the decoder the rank uses", None)


@EVENTS.register("world_cost")
@dataclass(frozen=True, kw_only=True, slots=True)
class WorldCost(Notice):
    """The first step after a world change: what the change cost."""

    change_s: float = doc("from the agreed step to this one, s")
    phases: dict | None = doc("... phase by phase, s", None)
    world_size: int | None = doc("ranks in the new world", None)
    global_step: int | None = doc("steps done since the run began", None)


@EVENTS.register("rollback")
@dataclass(frozen=True, kw_only=True, slots=True)
class Rollback(Notice):
    """The survivors of a rank's death went back to their newest common rollback point."""

    redone: int = doc("steps to train again")
    global_step: int | None = doc("the step they went back to", None)


@EVENTS.register("bad_sample")
@dataclass(frozen=True, kw_only=True, slots=True)
class BadSample(Notice):
    """A corrupt sample skipped."""

    bad_sample: int = doc("how many this rank has skipped")
    path: str | None = doc("its file", None)
    limit: int | None = doc("--max-bad-samples", None)


@EVENTS.register("autotune")
@dataclass(frozen=True, kw_only=True, slots=True)
class Autotune(Notice):
    """--autotune: the settings it kept."""

    autotune: dict = doc("the settings, by name")


@EVENTS.register("input_wait")
@dataclass(frozen=True, kw_only=True, slots=True)
class InputWait(Notice):
    """The input holds ranks back (a tenth of their step or more waiting for data), or keeps up
    again."""

    input_wait: dict = doc("`ranks` (the slots that wait; empty: it keeps up), `data_wait` "
                           "(the largest share of a step spent waiting, 0-1), `knob` (the key "
                           "or option most likely to help: p, W, w, --decode gpu; null: none "
                           "would)")


@EVENTS.register("usage")
@dataclass(frozen=True, kw_only=True, slots=True)
class Usage(Notice):
    """An error in the user's input, found in a rank (ddptui exits 2)."""


@EVENTS.register("checkpoint")
@dataclass(frozen=True, kw_only=True, slots=True)
class Checkpoint(Event):
    """A checkpoint file is on disk, complete (written, fsynced, renamed). Sent by rank 0."""

    path: str = doc("the file")
    epoch: int = doc("the epoch it resumes in")
    step: int = doc("the epoch's step it resumes at")
    global_step: int | None = doc("steps done since the run began", None)


@EVENTS.register("output")
@dataclass(frozen=True, kw_only=True, slots=True)
class Output(Event):
    """A script rank's latest line of output (stdout and stderr), at most a few a second."""

    text: str = doc("the line, escape sequences made inert")
    final: bool = doc("a whole line (false: a progress bar's latest state)")


@EVENTS.register("lines")
@dataclass(frozen=True, kw_only=True, slots=True)
class Lines(Event):
    """A rank under `python -m ddptui.wrap`: its whole lines since the last, about once a
    second; attach appends them to that rank's .rankN.out beside its log (not to the log)."""

    lines: list = doc("the lines, in order (stdout and stderr as they came)")
    dropped: int | None = doc("lines left out since the last: more than 500 a second", None)


@EVENTS.register("process")
@dataclass(frozen=True, kw_only=True, slots=True)
class Process(Event):
    """A script rank's process, as the parent sees it, once a second."""

    pid: int = doc("its process")
    status: str = doc("psutil's status: running, sleeping, stopped, disk-sleep, zombie; exited "
                      "once it ended (its figures null)")
    cpu_percent: float | None = doc("its CPU, % of one core")
    rss: int | None = doc("resident memory, MiB")
    gpu_mem: int | None = doc("its memory on its GPU, MiB (absent: none or unknown)", None)
    opt_steps: int | None = doc("optimizer steps it took (torch.optim's global hook)", None)
    moves: int | None = doc("times its main thread moved on (a hang never does)", None)


@EVENTS.register("error")
@dataclass(frozen=True, kw_only=True, slots=True)
class Error(Event):
    """How a script rank failed."""

    text: str = doc("the exception's line")
    traceback: list = doc("its traceback's last lines")
    exit_code: int | None = doc("its process's exit code")
    pid: int | None = doc("its process", None)


@EVENTS.register("beat")
@dataclass(frozen=True, kw_only=True, slots=True)
class Beat(Event):
    """A built-in rank's heartbeat, every 0.5 s, for the supervisor's stall watch only: it is
    not written to the log (the `rank` events say what the watch concluded)."""

    phase: str = doc("where its loop is: starting, input, compute, checkpoint, control, paused, "
                     "validate, world")
    global_step: int = doc("steps done since the run began")
    phase_s: float = doc("seconds it has been in that phase at that step")


@EVENTS.register("clock")
@dataclass(frozen=True, kw_only=True, slots=True)
class Clock(Event):
    """A rank's clock, sent first each time its link to `ddptui attach` connects: attach places
    the events after it (a backlog included) on its own clock by when they were sent, whatever
    the node's clock says. Not written to the log."""
