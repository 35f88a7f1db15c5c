"""What a script's output says, read without its process: figures and epochs from its lines,
progress bars collapsed, escape sequences made inert, tracebacks, torch's own log lines, crash causes."""

from __future__ import annotations

from dataclasses import asdict

from ddptui.contract.observe.metrics import MetricReader, compile_metrics, read_line
from ddptui.contract.observe.output import Lines, last_traceback
from ddptui.contract.safe_text import keep_colours, plain
from ddptui.contract.state.runstate import RunState
from tests.helpers.runlogs import logged

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
    reader = MetricReader(0, PATTERNS, lambda ev: sent.append((ev.NAME, asdict(ev))),
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
    state.apply(logged("output", 1, text="\x1b[1;32mok\x1b[0m step\x1b]0;title\x07\x1b[H",
                      final=True))
    from ddptui.dashboard.view.widgets.tables import RankTable

    rank = state.view().ranks[0]
    shown = RankTable()._script_cells(rank, 0.0)[4]  # the output column keeps the colours
    assert shown.plain == "ok step"
    assert [(span.start, span.end, span.style.color.name) for span in shown.spans] == \
        [(0, 2, "color(2)")]  # ANSI green
    state.apply(logged("message", 1, level="warning", text="x\x1b]0;title\x07\x1b[2Jy"))
    state.apply(logged("rank", 1, state="crashed", reason="boom\x1b[H", host="h\x07"))
    assert all("\x1b" not in line[3] and "\x07" not in line[3] for line in state.lines_after(0))
    assert state.ranks[1].reason == "boom" and state.ranks[1].host == "h"


def test_the_last_traceback_is_found_among_the_output():
    lines = ["step 1", "Traceback (most recent call last):", '  File "a.py", line 1', "old",
             "retrying", "Traceback (most recent call last):", '  File "t.py", line 9, in f',
             "    raise ValueError('x')", "ValueError: x", ""]
    assert last_traceback(lines, keep=3) == ['  File "t.py", line 9, in f',
                                              "    raise ValueError('x')", "ValueError: x"]
    assert last_traceback(["just", "a line"]) == ["just", "a line"]


def test_a_loss_line_per_step_becomes_at_most_20_step_events_a_second_none_lost():
    """600 loss lines a second for 10 s: about 20 step events a second, whose losses, weighted
    by the lines each covers, are every line's."""
    sent = []
    now = [0.0]
    reader = MetricReader(0, PATTERNS, lambda ev: sent.append(asdict(ev)), clock=lambda: now[0])
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


def test_torchs_and_ncclss_own_log_lines_are_told_from_the_scripts_output():
    from ddptui.contract.observe.output import library_log

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
    from ddptui.dashboard.view.widgets.header import RunHeader
    from ddptui.dashboard.view.widgets.tables import EpochTable

    now = [0.0]
    state = RunState({"script": "train.py", "model": "train.py", "world_size": 1,
                      "device_kind": "cpu", "epochs": 0})
    reader = MetricReader(0, PATTERNS, state.apply,
                          clock=lambda: now[0])
    state.apply(logged("rank", 0, state="running"))
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


def test_a_signal_is_the_cause_of_a_kill_and_a_crash_says_its_device_error():
    from ddptui.contract.observe.endings import crash_cause

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
