"""What runs inside a rank, without a world: the lagged loss meter, run.loader()'s live
settings, rollback points, the API without ddptui, and the wrapper's flight recorder."""

from __future__ import annotations

import os


def test_the_loss_meter_reads_interval_means_and_the_epochs_mean():
    import torch

    from ddptui.rank.telemetry.lagmeter import LagMeter

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

    from ddptui.rank.api.loader import LiveLoader

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


def test_a_live_loaders_length_is_counted_and_leaves_the_random_state_alone():
    import torch

    from ddptui.rank.api.loader import LiveLoader

    data = torch.utils.data.TensorDataset(torch.arange(50))
    torch.manual_seed(0)
    before = torch.random.get_rng_state()
    assert len(LiveLoader(data, batch_size=4, shuffle=True)) == 13
    assert len(LiveLoader(data, batch_size=4, shuffle=True, drop_last=True)) == 12
    assert torch.equal(torch.random.get_rng_state(), before)


def test_without_ddptui_every_call_is_a_no_op_and_the_loop_runs_as_written():
    """python train.py, or torchrun without DDPTUI_REPORT: the script works as if the lines
    were not there (run.elastic and run.guard included)."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    from ddptui.rank.api.session import Run

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


def test_a_rollback_point_gives_back_every_kind_of_state_a_script_returns():
    """run.elastic()'s state may hold named tuples, ordered dicts, numbers and strings beside
    its tensors; a point gives all of it back as it was, the model's buffers copied first."""
    from collections import OrderedDict, namedtuple

    import torch

    from ddptui.rank.api.rollback import Rollback

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


def test_the_wrapper_turns_the_flight_recorder_on_unless_the_user_set_it_up(monkeypatch,
                                                                            tmp_path):
    from ddptui.contract.observe.flight import FlightDumps, trace_env
    from ddptui.rank.wrap import rankwatch

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
