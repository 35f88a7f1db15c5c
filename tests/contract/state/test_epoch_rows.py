"""The run model's epoch rows and their lines: one line per epoch whatever order the ranks end
in, and a figure nobody measured is unknown (`-`, an empty CSV cell), never 0, None or a
default."""

from __future__ import annotations

import csv
import io
import json

import pytest

from ddptui.contract.protocol.codec import encode
from ddptui.contract.protocol.events import PARENT, Epoch
from ddptui.contract.state.runstate import RunState
from ddptui.dashboard.sources.export import write_epochs_csv
from tests.helpers.runlogs import logged, typed
from tests.helpers.runs import ROOT


def _script_epoch(rank: int, epoch: int) -> dict:
    """An epoch row a script's ddptui.init() sends (no run.loader(): no settings of ours)."""
    return logged("epoch", rank, epoch=epoch, seconds=2.0, samples=512, samples_per_s=256.0,
                 data_wait=0.1, settings={}, train_loss=1.0 / (epoch + 1), world_size=2)


def _printed_epoch(rank: int, epoch: int) -> dict:
    """An epoch row read from a script's output: no rates, no world size."""
    return logged("epoch", rank, epoch=epoch, seconds=2.0, samples=0, samples_per_s=0.0,
                 data_wait=0.0, settings={}, train_loss=1.0 / (epoch + 1), source="output")


def _said(state: RunState) -> list[str]:
    return [text for _, _, _, text, _ in state.lines_after(0)]


def test_every_epoch_of_a_script_is_said_once_even_when_a_rank_ended_first():
    """A 3-epoch script: rank 0 sent its last row and exited before rank 1's came; the events
    pane had no 'epoch 2' line (the table and the log had the row)."""
    state = RunState({"script": "train.py"})
    state.apply(typed(logged("run", PARENT, status="started", world_size=2, script="train.py")))
    for r in (0, 1):
        state.apply(typed(logged("rank", r, state="running")))
    for epoch in (0, 1):
        for r in (0, 1):
            state.apply(typed(_printed_epoch(r, epoch)))
    state.apply(typed(_printed_epoch(0, 2)))
    state.apply(typed(logged("rank", 0, state="done", exit_code=0)))
    state.apply(typed(_printed_epoch(1, 2)))
    state.apply(typed(logged("rank", 1, state="done", exit_code=0)))
    lines = [line for line in _said(state) if line.startswith("epoch ")]
    assert lines == ["epoch 0: loss 1.0000", "epoch 1: loss 0.5000", "epoch 2: loss 0.3333"]


def test_a_script_without_settings_of_ours_names_none():
    """ddptui.init() without run.loader(): its epoch lines said "[prefetch -, workers None,
    cudnn.benchmark off]"."""
    state = RunState({"script": "train.py"})
    for ev in (logged("rank", 0, state="running"), logged("rank", 1, state="running"),
               _script_epoch(0, 0), _script_epoch(1, 0)):
        state.apply(ev)
    (line,) = [line for line in _said(state) if line.startswith("epoch ")]
    assert line == "epoch 0: loss 1.0000  512 img/s (2 ranks)  data-wait 10%"


def test_a_scripts_printed_epochs_have_no_rate_and_the_csv_leaves_it_empty(tmp_path):
    """Epochs read from a script's output carry no rate: its CSV wrote samples_per_s 0."""
    log = tmp_path / "script.jsonl"
    evs = [logged("run", PARENT, status="started", world_size=2, script="train.py",
                 device_kind="cpu")]
    evs += [logged("rank", r, state="running") for r in (0, 1)]
    evs += [logged("epoch", r, epoch=0, seconds=3.0, samples=0, samples_per_s=0.0, data_wait=0.0,
                  settings={}, train_loss=0.5, source="output") for r in (0, 1)]
    log.write_text("".join(encode(e) for e in evs))
    out = io.StringIO()
    assert write_epochs_csv(str(log), out, warn=lambda text: None) == 1
    (row,) = csv.DictReader(io.StringIO(out.getvalue()))
    assert (row["samples_per_s"], row["data_wait"], row["train_loss"]) == ("", "", "0.5")


def test_a_cpu_runs_csv_says_prefetch_n_a_as_its_table_does():
    out = io.StringIO()
    write_epochs_csv(f"{ROOT}/tests/data/run-2cpu.jsonl", out, warn=lambda text: None)
    rows = list(csv.DictReader(io.StringIO(out.getvalue())))
    assert rows and {r["prefetch"] for r in rows} == {"n/a"}
    assert all(float(r["samples_per_s"]) > 0 for r in rows)


def test_a_scripts_run_runs_once_a_rank_does_and_a_row_with_one_held_out_figure_reads():
    """The header said STARTING beside rows that said stalled; an epoch with a validation
    accuracy and no loss (mmengine's, accelerate's) stopped a headless run on its line."""
    state = RunState({"script": "train.py", "world_size": 2})
    state.apply(typed(logged("run", PARENT, status="started", script="train.py")))
    assert state.status == "starting"
    state.apply(typed(logged("rank", 1, state="stalled", reason="no output for 60 s")))
    assert state.status == "running"
    state.apply(typed(logged("epoch", 0, epoch=1, seconds=2.0, samples=0, samples_per_s=0.0,
                      data_wait=0.0, settings={}, train_loss=None, val_acc=0.375,
                      source="output")))
    assert any("val_acc 37.5%" in line and "val_loss" not in line for line in _said(state))


def test_a_row_of_hundreds_of_ranks_keeps_few_events_and_merges_to_the_same_figures():
    """Past 16 ranks a row sums the rest as they come (attach keeps its rows beside its log):
    the merged row is the one every event would give, and a rank's row counted once."""
    from ddptui.contract.state.epochs import EpochRow
    from ddptui.contract.state.snapshot import dump, load

    evs = [Epoch(rank=r, epoch=3, seconds=100.0 + r, samples=1000, samples_per_s=10.0 + r,
                    data_wait=r / 1000, settings={"prefetch": True}, bad_samples=r % 3,
                    world_size=512, train_loss=1.5) for r in reversed(range(512))]
    row = EpochRow(3)
    for e in [*evs, evs[7]]:  # rank 504's row twice
        row.take(e)
    got = row.merged()
    assert len(row.ranks) == 17 and 0 in row.ranks  # rank 0's (the last to come) and 16
    assert got["ranks"] == 512 and got["world_size"] == 512 and got["train_loss"] == 1.5
    assert got["samples_per_s"] == pytest.approx(sum(10.0 + r for r in range(512)))
    assert got["data_wait"] == pytest.approx(sum(r / 1000 for r in range(512)) / 512)
    assert got["bad_samples"] == sum(r % 3 for r in range(512))
    assert got["seconds"] == 100.0 + 511
    state = RunState()
    state.epochs[(0, 3, 0)] = row
    assert load(json.loads(json.dumps(dump(state)))).epochs[(0, 3, 0)].merged() == got
