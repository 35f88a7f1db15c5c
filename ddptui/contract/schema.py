"""Every event and command that crosses the rank pipes, the attach channel and the JSONL log, as
TypedDicts: each field's type and meaning, in one place. contract.py checks a record against it
and writes docs/events.md from it.
"""

# No `from __future__ import annotations`: TypedDict must see NotRequired itself, not a string.
from typing import Annotated, Literal, NotRequired, TypedDict

Settings = Annotated[dict, "input-pipeline settings by name: prefetch (bool), workers (int), "
                           "cudnn_benchmark (bool)"]
Stacks = Annotated[str, "every thread's Python stack, as faulthandler prints them"]


class Event(TypedDict):
    """What every event carries."""

    t: Annotated[float, "unix time of the event, s"]
    kind: Annotated[str, "one of the kinds below"]
    rank: Annotated[int, "the rank slot it is about (its sender, for a rank's own); -1: the "
                         "parent, ddptui itself"]
    node: NotRequired[Annotated[str, "the host that sent it, added by a rank under torchrun or "
                                     "srun that reports to `ddptui attach`"]]


class StepEvent(Event):
    """A rank's progress, at most about 20 a second (fewer for slow steps). Sent by each rank;
    for a script, read from its output (`source: output`) or sent by `ddptui.init()`."""

    epoch: Annotated[int, "the epoch, from 0"]
    step: Annotated[int, "steps done in this epoch (the epoch's whole world counts one step)"]
    global_step: Annotated[int, "steps done since the run began"]
    loss: Annotated[float | None, "the mean training loss of the steps since the last step "
                                        "event, read with a lag (null: not read yet, or "
                                        "not finite)"]
    steps: NotRequired[Annotated[int, "steps the figures cover"]]
    samples_per_s: NotRequired[Annotated[float, "this rank's samples a second over those steps"]]
    step_ms: NotRequired[Annotated[float, "mean wall time of those steps, ms"]]
    data_wait: NotRequired[Annotated[float, "share of that time spent waiting for input, 0-1"]]
    progress: NotRequired[Annotated[float, "fraction of the epoch done, from the rank's sampler "
                                           "(right in any world size)"]]
    source: NotRequired[Annotated[Literal["output"], "read from the script's output: no rates"]]
    metrics: NotRequired[Annotated[dict, "other figures read from the script's output (`--metric`)"
                                   ", by name"]]
    iteration: NotRequired[Annotated[bool, "the script names no epochs (nanoGPT): `step` is its "
                                           "iteration since it began, the epoch stays 0"]]
    steps_per_s: NotRequired[Annotated[float, "steps (iterations) a second, read from the steps "
                                              "the script printed (no samples known)"]]


class GpuEvent(Event):
    """One device's readings, twice a second: a GPU's from NVML (the parent's sampler, or a
    rank's own without a ddptui parent), or a CPU rank's process tree from psutil."""

    gpu: Annotated[int | None, "the GPU's NVML index (null: a CPU rank)"]
    util: NotRequired[Annotated[float, "GPU utilisation, %"]]
    mem_used: NotRequired[Annotated[int, "GPU memory used, MiB (NVML v2: as nvidia-smi)"]]
    mem_total: NotRequired[Annotated[int, "GPU memory, MiB"]]
    power_w: NotRequired[Annotated[float | None, "power draw, W"]]
    temp_c: NotRequired[Annotated[float | None, "temperature, degrees C"]]
    sm_clock: NotRequired[Annotated[int | None, "SM clock, MHz"]]
    mem_clock: NotRequired[Annotated[int | None, "memory clock, MHz"]]
    held_down: NotRequired[Annotated[list, "NVML clock-event reasons in force (power cap, "
                                           "thermal, ...), by name"]]
    others: NotRequired[Annotated[list, "processes on the GPU that are not the run's: [pid, MiB, "
                                        "user, name] each"]]
    pcie_tx: NotRequired[Annotated[float, "PCIe sent, MB/s (absent where NVML has no counter)"]]
    pcie_rx: NotRequired[Annotated[float, "PCIe received, MB/s"]]
    nvlink_tx: NotRequired[Annotated[float, "NVLink sent, MB/s"]]
    nvlink_rx: NotRequired[Annotated[float, "NVLink received, MB/s"]]
    cpu_percent: NotRequired[Annotated[float, "a CPU rank's process tree (workers too): CPU, % "
                                              "of one core"]]
    rss: NotRequired[Annotated[int, "a CPU rank's process tree: resident memory, MiB"]]


class EpochEvent(Event):
    """The end of an epoch, or of the part of one between two changes (settings applied with
    `a`, a rank leaving or joining, a rollback, a quit). Sent by each rank for its own samples."""

    epoch: Annotated[int, "the epoch, from 0"]
    seconds: Annotated[float, "wall time of the segment, s"]
    samples: Annotated[int, "samples this rank trained in it"]
    samples_per_s: Annotated[float, "this rank's samples a second"]
    data_wait: Annotated[float, "share of the time spent waiting for input, 0-1"]
    settings: Annotated[dict, "the input-pipeline settings it ran under (see `settings`)"]
    train_loss: Annotated[float | None, "mean training loss"]
    steps: NotRequired[Annotated[int, "steps in the segment"]]
    start_step: NotRequired[Annotated[int, "the epoch's step it began at (0: the epoch's start)"]]
    end_step: NotRequired[Annotated[int, "the epoch's step it ended at"]]
    partial: NotRequired[Annotated[bool, "a part of an epoch (a change, a rollback, a quit)"]]
    world_size: NotRequired[Annotated[int, "ranks in the world during it"]]
    global_step: NotRequired[Annotated[int, "steps done since the run began, at its end"]]
    bad_samples: NotRequired[Annotated[int, "corrupt samples skipped in it, by this rank"]]
    val_loss: NotRequired[Annotated[float | None, "validation loss (after a whole epoch)"]]
    val_acc: NotRequired[Annotated[float | None, "validation top-1 accuracy, 0-1"]]
    val_samples: NotRequired[Annotated[int, "validation samples scored, all ranks together"]]
    rolled_back: NotRequired[Annotated[int, "the segment ended in a rollback that redid this "
                                            "many steps"]]
    at_quit: NotRequired[Annotated[bool, "the segment a quit ended"]]
    metrics: NotRequired[Annotated[dict, "a script's other figures of the epoch (`--metric`, "
                                         "`run.log`), by name"]]
    source: NotRequired[Annotated[Literal["output"], "read from a script's output: no rates, "
                                                     "no settings"]]
    at_step: NotRequired[Annotated[int, "a script that names no epochs: the row of an evaluation "
                                        "it printed at this iteration, over the iterations since "
                                        "the one before (`start_step` and `end_step` are it)"]]
    steps_per_s: NotRequired[Annotated[float, "steps (iterations) a second over the segment, "
                                              "from the steps a script printed"]]


class SettingsEvent(Event):
    """The input-pipeline settings: asked for (the parent, `requested`), acknowledged by the
    world's rank 0 (`pending`, until the next epoch or `a`) and put in force on every rank at
    one step (`applied`, sent by rank 0)."""

    settings: Settings
    status: NotRequired[Annotated[Literal["requested", "pending", "applied"],
                                  "where the change is (absent: applied)"]]
    epoch: NotRequired[Annotated[int, "the epoch they apply from"]]
    step: NotRequired[Annotated[int, "the epoch's step they apply from (applied with `a`)"]]
    request: NotRequired[Annotated[str | None, "the request's id: rank 0's `pending` names "
                                                     "the request it answers"]]


class RankEvent(Event):
    """A rank slot's state changed, or a detail of it (its standby, a verdict on a stall). Sent
    by the rank itself (running, done), by the parent (what it sees of the process), or by the
    watchdog."""

    state: Annotated[Literal["starting", "running", "standby", "stopped", "crashed", "restarting",
                             "stalled", "waiting", "slow", "unreachable", "done"],
                     "the slot's state (docs/dashboard.md: rank states)"]
    pid: NotRequired[Annotated[int | None, "its process"]]
    gpu: NotRequired[Annotated[int | None, "its GPU's NVML index (null: CPU)"]]
    device: NotRequired[Annotated[str, "its torch device, e.g. cuda:0 or cpu"]]
    host: NotRequired[Annotated[str, "its host name"]]
    reason: NotRequired[Annotated[str | None, "why it is in this state (a crash's cause, a "
                                                    "stall's verdict)"]]
    exit_code: NotRequired[Annotated[int | None, "its process's exit code, once it ended"]]
    standby: NotRequired[Annotated[str | bool | None, "out of the world: its warm standby "
                                                           "is `warming` or `ready`; a script's "
                                                           "joiner (restarting) is `preparing` "
                                                           "(its script runs up to run.elastic() "
                                                           "while the others train) or "
                                                           "`prepared` (they form the world "
                                                           "with it now)"]]
    world_rank: NotRequired[Annotated[int, "its rank in the world it entered"]]
    api: NotRequired[Annotated[str, "a script rank that called `ddptui.init()`: ddptui.init; "
                                    "one under `python -m ddptui.wrap`: ddptui.rank.wrap"]]
    control: NotRequired[Annotated[list, "the orders that script rank takes (pause, checkpoint, "
                                         "stop, settings, elastic)"]]
    alone: NotRequired[Annotated[bool, "that script rank has no process group: it takes the "
                                       "dashboard's orders itself, not agreed at one step"]]
    local_rank: NotRequired[Annotated[int, "a rank under `python -m ddptui.wrap`: its LOCAL_RANK "
                                           "on its node"]]
    seconds: NotRequired[Annotated[float, "stalled or waiting: seconds since its last step"]]
    process: NotRequired[Annotated[str, "stalled: its process state (running, sleeping, "
                                        "stopped, disk wait, zombie)"]]
    cpu_percent: NotRequired[Annotated[float | None, "stalled: its CPU, %"]]
    gpu_activity: NotRequired[Annotated[str | None, "stalled: its GPU busy or idle"]]
    phase: NotRequired[Annotated[str | None, "stalled: where its loop is (its last "
                                                   "heartbeat)"]]
    global_step: NotRequired[Annotated[int | None, "stalled: the step it last reported"]]
    waiting_for: NotRequired[Annotated[list, "waiting: the stalled ranks it waits for"]]
    cause: NotRequired[Annotated[str, "slow: the likely cause (data-wait, clocks, shared GPU, "
                                      "compute)"]]
    slower: NotRequired[Annotated[float, "slow: how much slower than the others' median, 0-1"]]


class WorldEvent(Event):
    """The world formed, or changed (a rank left, joined, or died and the rest re-formed)."""

    size: Annotated[int, "ranks in it"]
    ranks: Annotated[list, "the slots in it, in world-rank order"]
    generation: NotRequired[Annotated[int, "how many times it has formed, from 0"]]
    epoch: NotRequired[Annotated[int, "where it goes on from: the epoch"]]
    step: NotRequired[Annotated[int, "... and the epoch's step"]]
    global_step: NotRequired[Annotated[int, "steps done since the run began"]]
    base_lr: NotRequired[Annotated[float, "the learning rate after scaling to the new size"]]


class RunEvent(Event):
    """The run as a whole: started, paused, resumed, ended. The parent says started and how it
    ended; rank 0 says paused and resumed, at the step every rank holds at."""

    status: Annotated[Literal["started", "done", "failed", "interrupted", "paused", "resumed",
                              "pausing", "resuming"],
                      "pausing and resuming: asked for, not there yet (the parent's own)"]
    exit_code: NotRequired[Annotated[int | None, "how ddptui exits (0 done, 1 failed, 2 bad "
                                                       "input, 130 interrupted, 143 SIGTERM)"]]
    reason: NotRequired[Annotated[str, "why it failed or stopped"]]
    seconds: NotRequired[Annotated[float, "how long it ran, s"]]
    global_step: NotRequired[Annotated[int, "paused or resumed: the step every rank holds at"]]
    best_val_acc: NotRequired[Annotated[float | None, "the best validation accuracy seen"]]
    pid: NotRequired[Annotated[int, "started: ddptui's process"]]
    model: NotRequired[Annotated[str, "started: the model, or the script's label"]]
    data: NotRequired[Annotated[str, "started: the data"]]
    epochs: NotRequired[Annotated[int, "started: epochs to train (0: the script knows)"]]
    world_size: NotRequired[Annotated[int, "started: ranks"]]
    device_kind: NotRequired[Annotated[str, "started: cuda or cpu"]]
    gpus: NotRequired[Annotated[list, "started: the GPUs, by NVML index"]]
    batch_size: NotRequired[Annotated[int, "started: per rank"]]
    log: NotRequired[Annotated[str, "started: this log's path"]]
    checkpoint_dir: NotRequired[Annotated[str | None, "started: where checkpoints go"]]
    script: NotRequired[Annotated[str, "your own script's run: its command line"]]
    restart: NotRequired[Annotated[int, "a script's run: which start of its ranks, from 0"]]
    restarting: NotRequired[Annotated[bool, "a script attempt that ended: its ranks start again"]]


class MessageEvent(Event):
    """A line for the event pane and the headless console: progress, warnings, errors. Some
    carry figures beside the text."""

    level: Annotated[Literal["info", "warning", "error"], "how it is shown"]
    text: Annotated[str, "the line"]
    stacks_of: NotRequired[Annotated[int, "the rank whose stacks these are"]]
    stacks: NotRequired[Stacks]
    flight: NotRequired[Annotated[dict, "a wrapped rank's NCCL flight recorder, compact: its "
                                        "summary, the last collective each process group "
                                        "enqueued, the oldest still open"]]
    change_s: NotRequired[Annotated[float, "first step after a world change: what it cost, s"]]
    phases: NotRequired[Annotated[dict, "... phase by phase, s"]]
    redone: NotRequired[Annotated[int, "a rollback: steps to train again"]]
    bad_sample: NotRequired[Annotated[int, "a corrupt sample skipped: how many this rank has "
                                           "skipped"]]
    path: NotRequired[Annotated[str, "... its file"]]
    limit: NotRequired[Annotated[int, "... --max-bad-samples"]]
    decoder: NotRequired[Annotated[str, "--decode gpu: the decoder the rank uses"]]
    autotune: NotRequired[Annotated[dict, "--autotune: the settings it kept"]]
    input_wait: NotRequired[Annotated[dict, "the input holds ranks back (a tenth of their step "
                                            "or more waiting for data), or keeps up again: "
                                            "`ranks` (the slots that wait; empty: it keeps up), "
                                            "`data_wait` (the largest share, 0-1), `knob` (the "
                                            "key or option most likely to help: p, W, w, "
                                            "--decode gpu; null: none would)"]]
    usage: NotRequired[Annotated[bool, "an error in the user's input (ddptui exits 2)"]]
    num_classes: NotRequired[Annotated[int, "the data's classes"]]
    num_train: NotRequired[Annotated[int, "training samples"]]
    steps_per_epoch: NotRequired[Annotated[int, "steps in an epoch of the whole world"]]
    params: NotRequired[Annotated[int, "the model's parameters"]]
    epochs: NotRequired[Annotated[int, "the epochs the run trains, where a script says so "
                                       "(`run.epochs(n)`)"]]
    world_size: NotRequired[Annotated[int, "ranks in the world"]]
    global_step: NotRequired[Annotated[int, "steps done since the run began"]]


class CheckpointEvent(Event):
    """A checkpoint file is on disk, complete (written, fsynced, renamed). Sent by rank 0."""

    path: Annotated[str, "the file"]
    epoch: Annotated[int, "the epoch it resumes in"]
    step: Annotated[int, "the epoch's step it resumes at"]
    global_step: NotRequired[Annotated[int, "steps done since the run began"]]


class OutputEvent(Event):
    """A script rank's latest line of output (stdout and stderr), at most a few a second."""

    text: Annotated[str, "the line, escape sequences made inert"]
    final: Annotated[bool, "a whole line (false: a progress bar's latest state)"]


class LinesEvent(Event):
    """A rank under `python -m ddptui.wrap`: its whole lines since the last, about once a
    second; attach appends them to that rank's .rankN.out beside its log (not to the log)."""

    lines: Annotated[list, "the lines, in order (stdout and stderr as they came)"]
    dropped: NotRequired[Annotated[int, "lines left out since the last: more than 500 a second"]]


class ProcessEvent(Event):
    """A script rank's process, as the parent sees it, once a second."""

    pid: Annotated[int, "its process"]
    status: Annotated[str, "psutil's status: running, sleeping, stopped, disk-sleep, zombie; "
                           "exited once it ended (its figures null)"]
    cpu_percent: Annotated[float | None, "its CPU, % of one core"]
    rss: Annotated[int | None, "resident memory, MiB"]
    gpu_mem: NotRequired[Annotated[int | None, "its memory on its GPU, MiB (null: none "
                                                     "or unknown)"]]
    opt_steps: NotRequired[Annotated[int, "optimizer steps it took (torch.optim's global hook)"]]
    moves: NotRequired[Annotated[int, "times its main thread moved on (a hang never does)"]]


class ErrorEvent(Event):
    """How a script rank failed."""

    text: Annotated[str, "the exception's line"]
    traceback: Annotated[list, "its traceback's last lines"]
    exit_code: Annotated[int | None, "its process's exit code"]
    pid: NotRequired[Annotated[int, "its process"]]


class BeatEvent(Event):
    """A built-in rank's heartbeat, every 0.5 s, for the supervisor's stall watch only: it is
    not written to the log (the `rank` events say what the watch concluded)."""

    phase: Annotated[str, "where its loop is: starting, input, compute, checkpoint, control, "
                           "paused, validate, world"]
    global_step: Annotated[int, "steps done since the run began"]
    phase_s: Annotated[float, "seconds it has been in that phase at that step"]


EVENTS: dict[str, type] = {
    "step": StepEvent, "gpu": GpuEvent, "epoch": EpochEvent, "settings": SettingsEvent,
    "rank": RankEvent, "world": WorldEvent, "run": RunEvent, "message": MessageEvent,
    "checkpoint": CheckpointEvent, "output": OutputEvent, "lines": LinesEvent,
    "process": ProcessEvent,
    "error": ErrorEvent, "beat": BeatEvent,
}


class Command(TypedDict):
    """What every command carries. The dashboard's keys become commands for the parent's own
    thread; those for the ranks go to the world's rank 0, which offers them to every rank at
    an agreed step."""

    op: Annotated[str, "one of the ops below"]


class PauseCommand(Command):
    """space: every rank holds at the same step (`run` paused)."""


class ResumeCommand(Command):
    """space again: every rank goes on (`run` resumed)."""


class CheckpointCommand(Command):
    """c: every rank checkpoints at the same step (the built-in trainer writes with
    --checkpoint-dir; a script's `run.should_checkpoint`)."""


class StopCommand(Command):
    """q, Ctrl-C, SIGTERM: the ranks stop at an agreed step (the parent's own `stop` carries how
    the run ends)."""

    status: NotRequired[Annotated[str, "the parent's: the run's end status (interrupted, failed)"]]
    code: NotRequired[Annotated[int, "the parent's: ddptui's exit code"]]
    reason: NotRequired[Annotated[str, "the parent's: why"]]


class SettingsCommand(Command):
    """p, w, W, b: new input-pipeline settings from the next epoch."""

    settings: Settings
    request: Annotated[str, "the request's id, named by rank 0's `pending` answer"]


class ApplyCommand(Command):
    """a: pending settings apply at the next agreed step."""


class RankCommand(Command):
    """s, r, k, t on the selected rank (the parent's own: stop_rank, restart_rank, kill_rank,
    stacks)."""

    slot: Annotated[int, "the rank slot"]


class RestartCommand(Command):
    """s, r, k on a script's rank: every rank ends and the group starts again (the parent's)."""

    kill: Annotated[int | None, "a rank to SIGKILL at once (k)"]


class SidecarCommand(Command):
    """attach to a wrapped rank's sidecar (`python -m ddptui.wrap`), which acts from outside the
    rank: `kill` (k: SIGKILL at once), `end` (K, the whole job: SIGTERM, SIGKILL after `grace`)."""

    grace: NotRequired[Annotated[float, "end: seconds from the SIGTERM to the SIGKILL"]]


class WorldOrder(Command):
    """A change of the world, decided by the parent alone (ddptui/run/membership.py) and sent to
    ranks' command pipes (a script's under run.elastic(): its report channel): `reform` to the
    world's rank 0, which offers it to every member at an agreed step (a leave or a join); `join`
    to the joining standby; `recover` straight to every survivor after a rank died (they roll
    back and re-form without it); `host` to the world's rank 0 as a script's joiner is told to
    join: the new world's store listens at once, for the joiner's script to connect to."""

    members: Annotated[list, "the slots of the new world, in world-rank order"]
    gen: Annotated[int, "the world's generation (how many times it has formed)"]
    init: Annotated[str, "the new process group's rendezvous address, tcp://HOST:PORT"]
    joiner: NotRequired[Annotated[int, "reform and join: the slot that joins"]]
    prepare: NotRequired[Annotated[bool, "reform and join, a script's: the joiner (last in "
                                         "`members`) runs its script up to run.elastic() first; "
                                         "the reform goes to rank 0 once it is `prepared`"]]
    stop: NotRequired[Annotated[bool, "recover: the survivors checkpoint and end (a quit with a "
                                      "stalled rank)"]]


COMMANDS: dict[str, type] = {
    "pause": PauseCommand, "resume": ResumeCommand, "checkpoint": CheckpointCommand,
    "stop": StopCommand, "settings": SettingsCommand, "apply": ApplyCommand,
    "stop_rank": RankCommand, "restart_rank": RankCommand, "kill_rank": RankCommand,
    "stacks": RankCommand, "restart": RestartCommand, "kill": SidecarCommand,
    "end": SidecarCommand,
    "reform": WorldOrder, "join": WorldOrder, "recover": WorldOrder, "host": WorldOrder,
}

