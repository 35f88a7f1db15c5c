"""The pure parts of watching a script: figures read from its output, progress bars collapsed,
escape sequences made inert, stall verdicts and who waits for whom. No process is started."""

from __future__ import annotations

import os

import pytest

from ddptui.contract.events import event
from ddptui.contract.safe_text import keep_colours, plain
from ddptui.observe.metrics import MetricReader, compile_metrics, read_line
from ddptui.observe.output import Lines, last_traceback
from ddptui.observe.stalls import Reading, ScriptStalls, blame
from ddptui.state.runstate import RunState

PATTERNS = compile_metrics((("acc", None), ("top5", r"top-5:\s*([\d.]+)")))


def test_loss_is_read_as_scripts_and_frameworks_print_it():
    cases = {
        "rank 0 epoch 2 step 30 loss: 0.123": {"loss": 0.123, "epoch": 2, "step": 30},
        "Epoch 0:  50%|#####     | 5/10 [00:01<00:01, 4.5it/s, loss=0.693, v_num=0]":
            {"loss": 0.693, "epoch": 0},
        "{'loss': 0.6931, 'grad_norm': 1.2, 'learning_rate': 5e-05, 'epoch': 0.5}":
            {"loss": 0.6931, "lr": 5e-05, "epoch": 0.5},
        "{'eval_loss': 0.6, 'eval_accuracy': 0.81, 'epoch': 1.0}":
            {"val_loss": 0.6, "val_acc": 0.81, "epoch": 1.0},
        "Epoch [3/10], Step [100/600], Loss: 0.2345 acc=93.1 top-5: 99.0":
            {"loss": 0.2345, "acc": 93.1, "top5": 99.0, "epoch": 3, "step": 100},
        "train_loss=tensor(0.5000, device='cuda:0')": {"loss": 0.5},
        "{'loss': '0.6931', 'grad_norm': '1.2', 'epoch': '0.5'}": {"loss": 0.6931, "epoch": 0.5},
        "val_loss 0.25": {"val_loss": 0.25},
        "no figures in epoch 3": {},
        "the loss of 3 samples": {},
    }
    for line, expected in cases.items():
        assert read_line(line, PATTERNS) == expected, line


def test_epoch_rows_come_from_the_epochs_a_script_prints():
    sent = []
    clock = iter(range(100))
    reader = MetricReader(0, PATTERNS, lambda kind, **f: sent.append((kind, f)),
                          clock=lambda: float(next(clock)))
    for line in ["{'loss': 0.9, 'epoch': 0.5}", "{'loss': 0.7, 'epoch': 0.9}",
                 "{'eval_loss': 0.6, 'eval_accuracy': 0.8, 'epoch': 1.0}",
                 "{'loss': 0.5, 'epoch': 1.5}"]:
        reader.line(line, True)
    reader.finish_epoch(partial=True)
    epochs = [f for kind, f in sent if kind == "epoch"]
    # Hugging Face's evaluation says 'epoch': 1.0 once epoch 0 is done: it belongs to epoch 0.
    assert [(e["epoch"], e["val_loss"], e["val_acc"]) for e in epochs] == \
        [(0, 0.6, 0.8), (1, None, None)]
    assert abs(epochs[0]["train_loss"] - 0.8) < 1e-9 and epochs[1].get("partial")
    steps = [f for kind, f in sent if kind == "step"]
    assert [s["loss"] for s in steps] == [0.9, 0.7, 0.5]


def test_a_progress_bar_collapses_to_what_it_last_showed():
    lines = Lines()
    done, live = lines.feed(b"start\n\r 10%|#  | loss=0.9\r 20%|## | loss=0.8")
    assert done == ["start"] and live == "20%|## | loss=0.8"
    done, live = lines.feed(b"\r100%|###| loss=0.1\n\xe2\x9c")  # a UTF-8 character cut in two
    assert done == ["100%|###| loss=0.1"] and live == ""
    done, live = lines.feed(b"\x93 ok\n\x1b[31mred\x1b[0m text\x1b[2J\n")
    assert done == ["✓ ok", "\x1b[31mred\x1b[0m text"]  # its colours, not the screen clear
    done, live = lines.feed(b"a write cut sh")
    assert live == ""  # not a redraw: its rest follows


def test_escape_sequences_never_reach_the_terminal_raw():
    hostile = "a\x1b[2J\x1b]0;pwned\x07b \x1b[31mred\x1b[0m\r50%\x07\x1b[10;5H\x9b2J"
    assert plain(hostile) == "ab red50%"  # the C1 CSI (\\x9b) goes whole too
    assert keep_colours(hostile) == "ab \x1b[31mred\x1b[0m\r50%"
    state = RunState({"script": "x.py"})
    state.apply(event("output", 1, text="\x1b[1;32mok\x1b[0m step\x1b]0;title\x07\x1b[H",
                      final=True))
    from ddptui.view.widgets.tables import RankTable

    rank = state.view().ranks[0]
    shown = RankTable()._script_cells(rank, 0.0)[4]  # the output column keeps the colours
    assert shown.plain == "ok step"
    assert [(span.start, span.end, span.style.color.name) for span in shown.spans] == \
        [(0, 2, "color(2)")]  # ANSI green
    state.apply(event("message", 1, level="warning", text="x\x1b]0;title\x07\x1b[2Jy"))
    state.apply(event("rank", 1, state="crashed", reason="boom\x1b[H", host="h\x07"))
    assert all("\x1b" not in line[3] and "\x07" not in line[3] for line in state.lines_after(0))
    assert state.ranks[1].reason == "boom" and state.ranks[1].host == "h"


def test_the_last_traceback_is_found_among_the_output():
    lines = ["step 1", "Traceback (most recent call last):", '  File "a.py", line 1', "old",
             "retrying", "Traceback (most recent call last):", '  File "t.py", line 9, in f',
             "    raise ValueError('x')", "ValueError: x", ""]
    assert last_traceback(lines, keep=3) == ['  File "t.py", line 9, in f',
                                              "    raise ValueError('x')", "ValueError: x"]
    assert last_traceback(["just", "a line"]) == ["just", "a line"]


def _reading(slot=0, status="sleeping", cpu=0.0, gpu=None, last=None, gap=0.0) -> Reading:
    return Reading(slot, status, cpu, gpu, last, gap)


def test_a_rank_is_stalled_once_stopped_idle_or_silent_for_the_whole_limit():
    s = ScriptStalls(10)
    assert s.judge(_reading(status="stopped"), 100) is None
    why, fields = s.judge(_reading(status="stopped"), 110)
    assert why.startswith("process stopped for 10 s") and fields["cause"] == "stopped"
    s = ScriptStalls(10)  # busy, then idle: the clock starts when it goes idle
    assert s.judge(_reading(cpu=90, last=99), 100) is None
    assert s.judge(_reading(cpu=1, gpu=50, last=99), 101) is None  # its GPU works
    assert s.judge(_reading(cpu=1, gpu=2, last=105), 105) is None
    assert s.judge(_reading(cpu=1, gpu=2, last=108), 115) is None  # cool, but it prints
    why, fields = s.judge(_reading(cpu=1, gpu=2, last=108, gap=5), 118)
    assert fields["cause"] == "idle" and "GPU idle" in why
    s = ScriptStalls(10)  # busy but silent: 3 x its longest gap, at least the limit
    assert s.judge(_reading(cpu=100, last=100, gap=6), 117) is None
    why, fields = s.judge(_reading(cpu=100, last=100, gap=6), 118)
    assert fields["cause"] == "silent" and why.startswith("no output for 18 s")
    assert ScriptStalls(10).judge(_reading(cpu=100), 1000) is None  # never printed: no verdict
    # Idle before its first line: in the rendezvous, a peer still importing (CI, --stall-after
    # 3: rank 1 was flagged in init_process_group): only after the first line's allowance.
    s = ScriptStalls(3)
    assert s.judge(_reading(cpu=0), 100) is None and s.judge(_reading(cpu=0), 130) is None
    why, fields = s.judge(_reading(cpu=0), 160)
    assert fields["cause"] == "idle"


def _stacks(*frames: str) -> str:
    body = "\n".join(f'  File "{path}", line 1 in {fn}' for path, fn in frames)
    return ("Thread 0x1 (most recent call first):\n  File \"threading.py\", line 1 in run\n\n"
            f"Current thread 0x2 (most recent call first):\n{body}")


def test_ranks_blocked_in_a_collective_wait_for_the_one_stuck_in_its_own_code():
    in_allreduce = _stacks(("/x/torch/distributed/distributed_c10d.py", "all_reduce"),
                           ("/x/torch/distributed/c10d_logger.py", "wrapper"),
                           ("train.py", "main"))
    in_backward = _stacks(("/x/torch/autograd/graph.py", "_engine_run_backward"),
                          ("train.py", "main"))
    stuck = _stacks(("train.py", "stuck_here"), ("train.py", "main"))
    assert blame({0: in_allreduce, 1: stuck, 2: in_backward}) == {
        0: ("all_reduce", [1]), 2: ("backward (DDP's gradient all-reduce)", [1])}
    assert blame({0: in_allreduce, 2: in_backward}) == {}  # none singled out


def test_the_loss_meter_reads_interval_means_and_the_epochs_mean():
    import torch

    from ddptui.kit.telemetry.lagmeter import LagMeter

    meter = LagMeter()
    assert meter.read() is None
    for value in (1.0, 2.0, 3.0):
        meter.add(torch.tensor(value, dtype=torch.bfloat16))
    assert meter.read() == 2.0
    meter.add(torch.tensor(6.0))
    assert meter.read() == 6.0 and meter.read() == 6.0  # nothing new: the last interval's
    assert meter.epoch_mean() == 3.0
    meter.add(5.0)
    assert meter.epoch_mean() == 5.0 and meter.epoch_mean() is None


def test_a_live_loader_switches_settings_mid_epoch_without_losing_a_sample():
    import torch

    from ddptui.api.loader import LiveLoader

    data = torch.utils.data.TensorDataset(torch.arange(50))
    torch.manual_seed(0)
    applied = []
    live = LiveLoader(data, batch_size=4, shuffle=True, drop_last=False,
                      on_applied=lambda now, before: applied.append((now, before)))
    seen = []
    for i, (batch,) in enumerate(live):
        seen += batch.tolist()
        if i == 3:  # the dashboard's w/W then a, agreed after this step
            live.pending = {"workers": 1}
            live.switch = True
    assert sorted(seen) == list(range(50)) and seen == live.epoch_order
    assert applied == [({"prefetch": False, "workers": 1, "cudnn_benchmark": False},
                        {"prefetch": False, "workers": 0, "cudnn_benchmark": False})]
    live.pending = {"workers": 0}  # at the next epoch, without a
    assert sorted(b for (batch,) in live for b in batch.tolist()) == list(range(50))
    assert live.settings["workers"] == 0 and applied[1][1] is None  # an epoch's start


def test_a_stopped_rank_is_the_culprit_without_stacks():
    in_allreduce = _stacks(("/x/torch/distributed/distributed_c10d.py", "all_reduce"),
                           ("train.py", "main"))
    assert blame({0: in_allreduce}, frozen={1}) == {0: ("all_reduce", [1])}


def test_a_live_loaders_length_is_counted_and_leaves_the_random_state_alone():
    import torch

    from ddptui.api.loader import LiveLoader

    data = torch.utils.data.TensorDataset(torch.arange(50))
    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    assert len(LiveLoader(data, batch_size=4, shuffle=True)) == 13
    assert len(LiveLoader(data, batch_size=4, shuffle=True, drop_last=True)) == 12
    assert torch.equal(torch.random.get_rng_state(), before)


def test_the_nccl_flight_recorder_is_asked_through_its_pipe_and_read_without_torch(tmp_path):
    """What torch's NCCL watchdog does, played here: a FIFO it reads without blocking, and a
    dump written with torch's pickler (typed lists as torch.jit._pickle calls) once asked."""
    import os
    import pickle

    import torch.jit._pickle

    from ddptui.observe.flight import FlightDumps, summary

    class IntList(list):  # pickled as torch's pickler writes List[int]
        def __reduce__(self):
            return torch.jit._pickle.build_intlist, (list(self),)

    prefix = str(tmp_path / "x.nccl-trace-rank")
    dumps = FlightDumps(prefix)
    assert not dumps.ask(0, now=0.0)  # no pipe: no NCCL group, nothing to wait for
    os.mkfifo(prefix + "0.pipe")
    assert not dumps.ask(0, now=0.0)  # a pipe nobody reads (the rank's watchdog is gone)
    reader = os.open(prefix + "0.pipe", os.O_RDONLY | os.O_NONBLOCK)
    try:
        assert dumps.ask(0, now=0.0)
        assert os.read(reader, 128) == b"1"
        assert dumps.collect(now=1.0) == []  # asked, not written yet
        entry = {"profiling_name": "nccl:all_reduce", "collective_seq_id": 41,
                 "state": "completed", "process_group": ("0", "default_pg"),
                 "input_sizes": [IntList([256, 1000])]}
        trace = {"version": "2.4", "entries": [entry, {**entry, "collective_seq_id": 42,
                                                        "state": "started"}]}
        with open(prefix + "0", "wb") as f:
            pickle.dump(trace, f)
        assert dumps.collect(now=1.1) == []  # seen once: is it still growing?
        ((slot, read),) = dumps.collect(now=1.2)
        assert slot == 0 and read["entries"][0]["input_sizes"] == [[256, 1000]]
        assert summary(read) == "NCCL: in all_reduce #42 (started), process group default_pg"
        assert dumps.ask(0, now=2.0)
        assert dumps.collect(now=2.0 + 31) == [(0, None)]  # asked, and no dump came
    finally:
        os.close(reader)
    dumps.remove_pipes([0, 1])
    assert not os.path.exists(prefix + "0.pipe")


def test_the_nccl_dumps_name_the_rank_that_never_joined_the_collective_the_others_are_in():
    """DDP's all-reduce runs behind the Python: a rank that waits for a peer shows user code in
    its stacks, but its dump has all_reduce #42 open while the peer never enqueued #42."""
    from ddptui.observe.flight import behind, compact

    def trace(*entries):  # compact: as attach gets it from a wrapped rank, too
        return compact({"entries": [{"pg_id": 0, "profiling_name": "nccl:all_reduce",
                                     "collective_seq_id": seq, "state": state}
                                    for seq, state in entries]})

    done41 = [(40, "completed"), (41, "completed")]
    assert behind({0: trace(*done41, (42, "started")), 1: trace(*done41),
                   2: trace(*done41, (42, "scheduled"))}) == {
        0: ("all_reduce #42 (NCCL)", [1]), 2: ("all_reduce #42 (NCCL)", [1])}
    # every rank in #42: no rank is behind, so nobody is named
    assert behind({0: trace(*done41, (42, "started")), 1: trace(*done41, (42, "started"))}) == {}


def test_gpu_ranks_get_the_flight_recorder_unless_the_user_routes_its_dumps():
    from ddptui.script.launch import Attempt, rank_env
    from ddptui.script.options import ScriptConfig

    attempt = Attempt("id", 0, 29500, "127.0.0.1:1", "k")
    gpu = ScriptConfig(target="t.py", gpus=(0, 1))
    env = rank_env(gpu, attempt, 1, "s", base={}, trace_prefix="runs/x.nccl-trace-rank")
    assert env["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] == "runs/x.nccl-trace-rank"
    assert int(env.get("TORCH_FR_BUFFER_SIZE") or env["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0
    mine = rank_env(gpu, attempt, 1, "s", base={"TORCH_NCCL_DEBUG_INFO_TEMP_FILE": "/d/fr_"},
                    trace_prefix="runs/x.nccl-trace-rank")
    assert "TORCH_NCCL_DEBUG_INFO_PIPE_FILE" not in mine
    cpu = rank_env(ScriptConfig(target="t.py", cpus=2), attempt, 1, "s", base={},
                   trace_prefix="runs/x.nccl-trace-rank")
    assert "TORCH_NCCL_DEBUG_INFO_PIPE_FILE" not in cpu


def test_gpu_ranks_give_up_on_a_dead_peer_inside_nccls_set_up_in_seconds_unless_told_otherwise():
    from ddptui.script.launch import Attempt, rank_env
    from ddptui.script.options import ScriptConfig

    attempt = Attempt("id", 0, 29500, "127.0.0.1:1", "k")
    gpu = ScriptConfig(target="t.py", gpus=(0, 1))
    env = rank_env(gpu, attempt, 1, "s", base={})
    tries, sleep = int(env["NCCL_SOCKET_RETRY_CNT"]), int(env["NCCL_SOCKET_RETRY_SLEEP_MSEC"])
    assert sleep * tries * (tries + 1) / 2 < 5000  # NCCL waits a little longer at each try
    mine = rank_env(gpu, attempt, 1, "s", base={"NCCL_SOCKET_RETRY_CNT": "34"})
    assert mine["NCCL_SOCKET_RETRY_CNT"] == "34"
    # The built-in loop's worlds are made abortable; a script's own communicators are not
    # touched (the set-up timeout holds only for the non-blocking ones ddptui forms).
    from ddptui.kit.environment import nccl_defaults

    assert "NCCL_RUNTIME_CONNECT" not in env and env["TORCH_NCCL_NONBLOCKING_TIMEOUT"] == "5"
    assert "NCCL_CUMEM_ENABLE" not in env
    builtin = {"TORCH_NCCL_NONBLOCKING_TIMEOUT": "60", "NCCL_CUMEM_ENABLE": "1"}
    nccl_defaults(builtin, abortable=True)
    assert builtin["NCCL_RUNTIME_CONNECT"] == "0" and builtin["TORCH_NCCL_NONBLOCKING_TIMEOUT"] == "60"
    assert builtin["NCCL_CUMEM_ENABLE"] == "1"  # the user's choice stands
    assert nccl_defaults(fresh := {}, abortable=True) is None and fresh["NCCL_CUMEM_ENABLE"] == "0"


def test_stalled_gpu_ranks_are_told_apart_by_their_nccl_dumps(tmp_path):
    """Both ranks stalled, both stacks in user code: the dumps show rank 0 inside all_reduce #42
    that rank 1 never joined, so rank 0 is `waiting` for rank 1 and rank 1 stays `stalled`."""
    from types import SimpleNamespace

    from ddptui.script.options import ScriptConfig
    from ddptui.script.watch import ScriptWatch

    said: list[dict] = []
    watch = ScriptWatch(ScriptConfig(target="t.py", gpus=(0, 1)), said.append,
                        lambda text, level="info", **f: said.append({"text": text, **f}),
                        trace_prefix=str(tmp_path / "x.nccl-trace-rank"))

    def trace(*entries):
        return {"entries": [{"pg_id": 0, "profiling_name": "nccl:all_reduce",
                             "collective_seq_id": seq, "state": state} for seq, state in entries]}

    dumps = {0: trace((41, "completed"), (42, "started")), 1: trace((41, "completed"))}
    watch.flight.collect = lambda now: list(dumps.items())
    watch.flags = {0: "stalled", 1: "stalled"}
    ranks = {s: SimpleNamespace(slot=s, pid=100 + s, gpu=s) for s in (0, 1)}
    watch.collect_stacks(ranks, now=1.0)
    verdicts = [(e["rank"], e["state"], e.get("waiting_for")) for e in said
                if e.get("kind") == "rank"]
    assert verdicts == [(0, "waiting", [1])] and watch.flags == {0: "waiting", 1: "stalled"}
    assert "rank 1: NCCL: in no collective; the last, all_reduce #41, completed" in \
        [e.get("text") for e in said]


def test_attach_blames_the_rank_on_another_node_that_never_entered_the_collective():
    """Wrapped ranks on two nodes, both stalled with stacks in user code: their flight recorders
    (sent compact over the link) show rank 0 in all_reduce #42, which rank 1 on the other node
    never enqueued: rank 0 is `waiting` for rank 1, named with its node; rank 1 stays stalled."""
    from ddptui.observe.flight import compact
    from ddptui.sources.remote_watch import RemoteWatch

    recorded: list[dict] = []
    watch = RemoteWatch(10.0, recorded.append, lambda rank: True)

    def trace(*entries):
        return {"entries": [{"pg_id": 0, "profiling_name": "nccl:all_reduce",
                             "collective_seq_id": seq, "state": state} for seq, state in entries]}

    for rank in (0, 1):
        watch.observe({"kind": "rank", "rank": rank, "state": "running", "api": "ddptui.wrap",
                       "host": "vm", "node": f"vm/{rank}", "local_rank": 0}, 0.0)
    watch.flags = {0: ("stalled", 1.0), 1: ("stalled", 1.0)}
    dumps = {0: trace((41, "completed"), (42, "started")), 1: trace((41, "completed"))}
    for rank in (0, 1):
        watch.observe({"kind": "message", "rank": rank, "stacks_of": rank,
                       "stacks": 'File "train.py", line 3 in misbehave'}, 2.0)
    assert recorded == []  # both in the script's own code: the stacks alone blame nobody
    for rank, dump in dumps.items():
        watch.observe({"kind": "message", "rank": rank, "stacks_of": rank, "stacks": "NCCL: ...",
                       "flight": compact(dump)}, 3.0)
    assert [(e["rank"], e["state"], e["waiting_for"]) for e in recorded] == [(0, "waiting", [1])]
    assert recorded[0]["reason"] == \
        "in all_reduce #42 (NCCL): waiting for rank 1 (node vm/1, local 0)"
    assert watch.flags[1][0] == "stalled"
    # Rank 1 is killed (k): rank 0, still held in the collective 2 s later (NCCL waits out its
    # timeout), cannot go on, said once; a rank that ends a moment after its peer is not stuck.
    watch.observe({"kind": "rank", "rank": 1, "state": "crashed",
                   "reason": "killed by SIGKILL (k)"}, 3.5)
    watch.check(4.0)
    assert [e.get("text") for e in recorded if e["kind"] == "message"] == []
    for now in (6.0, 7.0):
        watch.check(now)
    assert [e["text"] for e in recorded if e["kind"] == "message"] == [
        "rank 0 waits in all_reduce #42 (NCCL) for rank 1, which ended (killed by SIGKILL (k)): "
        "the job cannot go on; K ends it"]


def test_attach_keeps_a_hung_rank_flagged_through_torchs_own_log_lines():
    """Asking a stalled wrapped rank for its flight recorder makes torch log on its stderr (seen
    on 2 x H100: both ranks shown running 0.5 s after the verdict): only the script's own output
    or a step ends the verdict."""
    from ddptui.sources.remote_watch import RemoteWatch

    recorded: list[dict] = []
    watch = RemoteWatch(10.0, recorded.append, lambda rank: True)
    watch.observe({"kind": "rank", "rank": 1, "state": "running", "api": "ddptui.wrap"}, 0.0)
    watch.observe({"kind": "process", "rank": 1, "status": "sleeping", "cpu_percent": 0.0}, 0.5)
    watch.observe({"kind": "output", "rank": 1, "text": "epoch 0 step 9 loss: 1.5"}, 1.0)
    watch.observe({"kind": "process", "rank": 1, "status": "sleeping", "cpu_percent": 0.0}, 12.0)
    watch.check(12.0)
    assert [e["state"] for e in recorded] == ["stalled"]
    torch_says = "[rank1]:[W1126 14:16:43.123456789 ProcessGroupNCCL.cpp:1500] [PG 0 Rank 1] dump"
    watch.observe({"kind": "output", "rank": 1, "text": torch_says, "final": True}, 12.4)
    watch.observe({"kind": "lines", "rank": 1, "lines": [torch_says, torch_says]}, 12.5)
    watch.observe({"kind": "process", "rank": 1, "status": "sleeping", "cpu_percent": 0.0}, 13.0)
    watch.check(13.0)
    assert [e["state"] for e in recorded] == ["stalled"]
    watch.observe({"kind": "lines", "rank": 1, "lines": [torch_says, "epoch 0 step 10 loss: 1.4"]},
                  14.0)
    assert [(e["state"], e.get("reason")) for e in recorded][1:] == \
        [("running", "making progress again")]


def test_the_wrapper_turns_the_flight_recorder_on_unless_the_user_set_it_up(monkeypatch,
                                                                            tmp_path):
    from ddptui.observe.flight import FlightDumps, trace_env
    from ddptui.wrap import rankwatch

    size, dump_file, pipe = trace_env("", {})
    for name in (size, dump_file, pipe):
        monkeypatch.delenv(name, raising=False)
    prefix = rankwatch._flight_recorder(str(tmp_path))
    assert os.environ[pipe] == os.environ[dump_file] == prefix
    assert prefix.startswith(str(tmp_path)) and int(os.environ[size]) > 0
    # no process group listens on its pipe: nothing is waited for
    assert FlightDumps(prefix).ask(0, 0.0) is False
    monkeypatch.setenv(pipe, "/mine/trace")
    assert rankwatch._flight_recorder(str(tmp_path)) is None


def test_without_ddptui_every_call_is_a_no_op_and_the_loop_runs_as_written():
    """python train.py, or torchrun without DDPTUI_REPORT: the script works as if the lines
    were not there (run.elastic and run.guard included)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from ddptui.api.session import Run

    run = Run(None)
    loader = run.loader(TensorDataset(torch.arange(8)), batch_size=4)
    assert type(loader) is DataLoader
    run.elastic(lambda: {}, lambda state: None)
    seen = []
    for epoch in run.epochs(2, loader):
        for (x,) in loader:
            with run.guard():
                run.step(x.sum(), samples=len(x))
            seen.append((epoch, x.tolist()))
    run.done()
    assert seen == [(0, [0, 1, 2, 3]), (0, [4, 5, 6, 7]), (1, [0, 1, 2, 3]), (1, [4, 5, 6, 7])]


def test_a_loss_line_per_step_becomes_at_most_20_step_events_a_second_none_lost():
    """600 loss lines a second for 10 s: about 20 step events a second, whose losses, weighted
    by the lines each covers, are every line's."""
    sent = []
    now = [0.0]
    reader = MetricReader(0, PATTERNS, lambda kind, **f: sent.append(f), clock=lambda: now[0])
    losses = [1 / (i + 1) for i in range(6000)]
    for i, loss in enumerate(losses):
        now[0] = i / 600
        reader.line(f"step {i} loss: {loss}", True)
    reader.finish_epoch()
    assert 190 <= len(sent) <= 202
    assert sum(s["steps"] for s in sent) == 6000
    total = sum(s["loss"] * s["steps"] for s in sent)
    assert abs(total - sum(losses)) < 1e-6
    assert sent[-1]["step"] == 5999


def test_a_signal_is_the_cause_of_a_kill_and_a_crash_says_its_device_error():
    from ddptui.observe.endings import crash_cause

    warning = ["/x/lightning.py:12: FutureWarning: `foo` is deprecated"]
    assert crash_cause(-9, warning) == "killed by SIGKILL"
    assert crash_cause(-15, ["ConnectionResetError: [Errno 104] Connection reset by peer"]) \
        == "killed by SIGTERM"
    asserts = ["/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:111: operator(): block: "
               "[0,0,0], thread: [0,0,0] Assertion `-sizes[i] <= index && index < sizes[i] && "
               "\"index out of bounds\"` failed."] * 3
    tail = ["terminate called after throwing an instance of 'c10::AcceleratorError'",
            "  what():  CUDA error: device-side assert triggered"]
    cause = crash_cause(-6, asserts + tail)
    assert cause.startswith("killed by SIGABRT: IndexKernel.cu:111") and "index out of bounds" in cause
    assert crash_cause(-11, ["CUDA error: an illegal memory access was encountered"]) == \
        "killed by SIGSEGV: CUDA error: an illegal memory access was encountered"
    assert crash_cause(-6, ["nothing said"]) == "killed by SIGABRT"
    assert crash_cause(-6, ["malloc(): unsorted double linked list corrupted",
                            "Fatal Python error: Aborted"]) == \
        "killed by SIGABRT: malloc(): unsorted double linked list corrupted"
    # A rank's faulthandler says where the crashing thread was (the main thread need not be it).
    fatal = ["Fatal Python error: Segmentation fault", "",
             "Thread 0x00007f1 (most recent call first):",
             '  File "/x/threading.py", line 359 in wait', "",
             "Current thread 0x00007f2 (most recent call first):",
             '  File "/t/distributed_c10d.py", line 3068 in all_reduce',
             '  File "/t/c10d_logger.py", line 83 in wrapper',
             '  File "/w/world.py", line 81 in make_communicator', "", "Extension modules: x"]
    assert crash_cause(-11, fatal) == \
        "killed by SIGSEGV in all_reduce (distributed_c10d.py:3068) < wrapper (c10d_logger.py:83)"
    assert crash_cause(-6, ["RuntimeError: rank 1 gave up at epoch 1",
                            "terminate called without an active exception"]) == \
        "killed by SIGABRT: RuntimeError: rank 1 gave up at epoch 1"
    assert crash_cause(1, ["ValueError: bad"]) == "ValueError: bad"


def test_a_rendezvous_port_is_out_of_the_kernels_range_held_from_others_and_open_to_rank_0():
    """Ports the kernel hands out to any connection or bind(0) were taken between the pick and
    rank 0's store listening (EADDRINUSE lost a GPU run): the pick comes from below them. Two
    runs side by side picked the same port: a picked port is held, refused to any other pick
    (the check is a plain bind), and taken over by rank 0's store."""
    import socket
    from datetime import timedelta

    import torch.distributed as dist

    from ddptui.run.ports import ephemeral_ports, free_port

    low, _ = ephemeral_ports()
    ports = [free_port() for _ in range(12)]
    assert all(1024 <= port < low for port in ports) and len(set(ports)) == 12
    with socket.socket() as s:
        with pytest.raises(OSError):
            s.bind(("127.0.0.1", ports[-1]))
    store = dist.TCPStore("127.0.0.1", ports[-1], 1, is_master=True,
                          timeout=timedelta(seconds=10), wait_for_workers=False)
    store.set("rank 0", "listens")
    assert dist.TCPStore("127.0.0.1", ports[-1], 1, timeout=timedelta(seconds=10),
                         wait_for_workers=False).get("rank 0") == b"listens"


def test_torchs_and_ncclss_own_log_lines_are_told_from_the_scripts_output():
    from ddptui.observe.output import library_log

    assert library_log("[rank0]:[E1126 12:34:56.789012345 ProcessGroupNCCL.cpp:632] [Rank 0] "
                       "Watchdog caught collective operation timeout")
    assert library_log("[W1126 10:00:00.123456 socket.cpp:200] [c10d] connect failed")
    assert library_log("gpu-node1:12345:12400 [0] NCCL INFO comm 0x5 rank 0 nranks 2")
    assert not library_log("epoch 1 step 20 loss: 0.2")
    assert not library_log("[rank0]: Traceback (most recent call last):")


def test_a_script_that_names_no_epochs_shows_its_iterations_their_rate_and_eval_rows():
    """nanoGPT's train.py: 'iter N: loss X' lines and 'step N: train loss X, val loss Y'
    evaluations. Rows are its evaluations, the live row and the header its iteration and
    it/s; nothing says epoch 0 at 0%."""
    from ddptui.view.widgets.header import RunHeader
    from ddptui.view.widgets.tables import EpochTable

    now = [0.0]
    state = RunState({"script": "train.py", "model": "train.py", "world_size": 1,
                      "device_kind": "cpu", "epochs": 0})
    reader = MetricReader(0, PATTERNS, lambda kind, **f: state.apply(event(kind, 0, **f)),
                          clock=lambda: now[0])
    state.apply(event("rank", 0, state="running"))
    lines = ["step 0: train loss 4.2000, val loss 4.2100"]
    lines += [f"iter {i}: loss {4 - i / 100:.4f}, time 100.00ms, mfu 1.00%"
              for i in range(0, 250, 10)]
    lines += ["step 250: train loss 2.0821, val loss 2.1134"]
    lines += [f"iter {i}: loss 2.0000, time 100.00ms, mfu 1.00%" for i in range(250, 300, 10)]
    for line in lines:
        now[0] += 1.0  # ten iterations a second
        reader.line(line, True)
        reader.flush(force=True)
    view = state.view()
    rows = view.epochs
    assert [(e["at_step"], e["val_loss"]) for e in rows] == [(0, 4.21), (250, 2.1134)]
    assert rows[1]["train_loss"] == 2.0821 and abs(rows[1]["steps_per_s"] - 250 / 26) < 1e-3
    table = EpochTable()
    table.columns_now = table.SCRIPT_COLUMNS
    assert [table._cells(e)[:2] for e in rows][1] == ("step 250", "9.6it/s")
    live = [str(c) for c in table._live_cells(view.live_epoch)]
    assert live[0].startswith("step 290 ") and "%" not in live[0] and live[1] == "10.0it/s"
    header = RunHeader()
    header.view = view
    second = str(header._script(view, view.meta, 1, "CPU", "RUNNING")[1])
    assert second.startswith("step 290 ") and "10.0 it/s" in second and "epoch" not in second


def test_a_rollback_point_gives_back_every_kind_of_state_a_script_returns():
    """run.elastic()'s state may hold named tuples, ordered dicts, numbers and strings beside
    its tensors; a point gives all of it back as it was, the model's buffers copied first."""
    from collections import OrderedDict, namedtuple

    import torch

    from ddptui.api.rollback import Rollback

    Best = namedtuple("Best", "loss epoch")
    model = torch.nn.BatchNorm1d(2)
    live = {"model": model.state_dict(), "best": Best(torch.tensor(0.5), 3),
            "extra": OrderedDict(lr=0.1, note="warm", hist=[torch.ones(2), None])}
    loaded = []
    rollback = Rollback(lambda: live, loaded.append, model, cuda=False)
    rollback.take(4, {"global_step": 4})
    assert rollback.points.buffers == 3  # running mean, var, batches tracked
    with torch.no_grad():
        model.running_mean.add_(7)
        live["best"].loss.fill_(9)
    live["extra"]["note"] = "changed"
    assert rollback.restore(4)["global_step"] == 4
    (state,) = loaded
    assert isinstance(state["best"], Best) and state["best"].epoch == 3
    assert type(state["extra"]) is OrderedDict and state["extra"]["note"] == "warm"
    assert state["extra"]["hist"][1] is None and state["extra"]["lr"] == 0.1
    assert float(state["best"].loss) == 0.5 and model.running_mean.tolist() == [0.0, 0.0]
    rollback.close()


def test_ranks_given_a_gpu_each_that_all_run_on_one_are_found():
    """torch.distributed.launch's scripts under torchrun: every rank took its --local_rank
    default and so GPU 0; a rank that holds memory nowhere yet, or one rank alone, says nothing."""
    from ddptui.script.watch import one_gpu

    assert one_gpu({0: {0}, 1: {0}, 2: {0}}) == 0
    assert one_gpu({0: {0}, 1: {1}}) is None
    assert one_gpu({0: {0}, 1: {0, 1}}) is None
    assert one_gpu({0: {0}, 1: set()}) is None
    assert one_gpu({0: {0}}) is None
