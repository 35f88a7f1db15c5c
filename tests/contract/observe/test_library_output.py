"""The lines of the training libraries users run, read from their real output (tests/data/output,
recorded as its README says): each training line a step with its loss, each library's epochs
its rows, held-out figures in those rows and never a step, summaries no step at all."""

from __future__ import annotations

import os
from dataclasses import asdict

import pytest

from ddptui.contract.observe.endings import crash_cause
from ddptui.contract.observe.metrics import MetricReader, compile_metrics
from ddptui.contract.observe.output import Lines, last_traceback
from ddptui.contract.safe_text import plain
from tests.helpers.runs import ROOT

OUTPUT = os.path.join(ROOT, "tests", "data", "output")


def _read(name: str) -> tuple[list[dict], list[dict]]:
    """(step events, epoch events) from a recorded output, a second apart (none merged)."""
    sent: list[tuple[str, dict]] = []
    seconds = iter(range(1_000_000))
    reader = MetricReader(0, compile_metrics(), lambda ev: sent.append((ev.NAME, asdict(ev))),
                          clock=lambda: float(next(seconds)))
    lines = Lines()
    with open(os.path.join(OUTPUT, name), "rb") as f:
        done, _ = lines.feed(f.read())
    for line in done + lines.finish():
        reader.line(plain(line), True)
    reader.finish_epoch()
    return [f for k, f in sent if k == "step"], [f for k, f in sent if k == "epoch"]


def _rows(epochs: list[dict]) -> list[tuple]:
    return [(e["epoch"], e["val_loss"], e["val_acc"]) for e in epochs]


def test_timm_train_and_test_lines_and_its_result_summary():
    steps, epochs = _read("timm_train.rank0.txt")
    assert [round(s["loss"], 3) for s in steps[:4]] == [0.740, 0.753, 0.634, 0.738]
    assert len(steps) == 12  # 4 a epoch; its Test lines and --result's "loss" are no steps
    assert _rows(epochs) == [(0, 0.694, 0.5), (1, 0.697, 0.5), (2, 0.702, 0.5)]


def test_mmengine_epochs_and_its_validation_accuracy():
    steps, epochs = _read("mmengine_distributed_training.rank0.txt")
    assert [(s["epoch"], s["step"], round(s["loss"], 4)) for s in steps] == [
        (1, 10, 5.0815), (1, 20, 2.6663), (2, 10, 2.5859), (2, 20, 2.6283)]
    assert _rows(epochs) == [(1, None, 0.096875), (2, None, 0.08125)]


def test_lightnings_tqdm_bar_keeps_the_last_validation_in_the_next_epochs_line():
    steps, epochs = _read("lightning_tqdm.rank0.txt")
    assert steps and all(s["loss"] < 1 for s in steps)
    assert _rows(epochs) == [(0, 0.641, 0.719), (1, 0.582, 0.844), (2, 0.525, 0.875)]


def test_hugging_faces_log_dicts_their_epochs_done_and_the_runs_totals():
    steps, epochs = _read("hf_trainer.rank0.txt")
    assert len(steps) == 8  # its eval dicts and the final train_runtime dict are none
    assert [(e["epoch"], e["val_loss"]) for e in epochs] == [(0, 1.388), (1, 1.388)]


def test_accelerates_printed_evaluation_is_each_epochs_row():
    steps, epochs = _read("accelerate_nlp_example.rank0.txt")
    assert steps == []
    assert _rows(epochs) == [(0, None, 0.375), (1, None, 0.375), (2, None, 0.375)]


@pytest.mark.parametrize("name", ["fairseq_0.12_simple.txt", "fairseq_0.12_json.txt",
                                  "fairseq_0.9_simple.txt", "fairseq_0.9_json.txt"])
def test_fairseq_updates_validation_and_epoch_averages(name):
    steps, epochs = _read(name)
    per_epoch = 3 if "0.12" in name else 2  # train_inner lines; the epochs' averages are none
    assert len(steps) == 3 * per_epoch and steps[0]["epoch"] == 1
    assert [e["epoch"] for e in epochs] == [1, 2, 3]
    assert all(e["val_loss"] is not None and 6.8 < e["val_loss"] < 6.9 for e in epochs)


def test_detectron2s_iterations_and_total_loss_its_evaluation_no_step():
    steps, epochs = _read("detectron2_train_net.txt")
    assert [(s["step"], s["loss"]) for s in steps] == [(19, 2.082), (39, 1.591), (59, 1.292)]
    assert all(s.get("iteration") for s in steps) and epochs == []


def test_a_failures_cause_is_its_exception_line_never_a_launchers_report():
    """torchrun's report after its ChildFailedError ends in a row of '=' (the cause was that
    row, or the report's last field); a rank's own traceback gives its exception."""
    def cause(name: str) -> str:
        with open(os.path.join(OUTPUT, name)) as f:
            return crash_cause(1, last_traceback(f.read().splitlines()))

    assert cause("timm_train_cpu_ddp_crash.torchrun.txt") == \
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError:"
    assert cause("timm_train_cpu_ddp_crash.rank1.txt").startswith(
        "ValueError: DistributedDataParallel device_ids and output_device arguments")


def test_every_library_of_the_table_has_a_shape_and_a_recorded_output():
    from ddptui.contract.observe.shapes import SHAPES

    libraries = {shape.library for shape in SHAPES} - {"json"}
    recorded = {name.split("_")[0].replace("hf", "transformers") for name in os.listdir(OUTPUT)
                if name.endswith(".txt")}
    assert libraries <= recorded, libraries - recorded
