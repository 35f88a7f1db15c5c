"""Pieces of the rank side on their own, without processes: rollback-point agreement and
restore (AdamW's state included), the checkpoint writer, the sampler's re-sharding (every sample
once across a change of world size), the event buffer's bound and restore, the mailbox
publishing an urgent order only once its abort is over, and a rank's wait for the store."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import socket
import threading
import time

import pytest
import torch

from ddptui.contract.environment import cuda_defaults
from ddptui.contract.options.config import DataOptions, RunConfig, TrainOptions
from ddptui.contract.protocol.codec import encode
from ddptui.contract.protocol.events import Notice
from ddptui.contract.protocol.orders import Recover, Reform
from ddptui.rank.elastic.control import Mailbox, OrderPipe
from ddptui.rank.elastic.snapshot import Snapshots, WorldLost, agree, buffer_count, state_tensors
from ddptui.rank.elastic.store import await_store, meet
from ddptui.rank.sampler import ShardedBatchSampler
from ddptui.rank.telemetry.buffer import EventBuffer
from ddptui_trainer.build import build_optimizer
from ddptui_trainer.checkpoint import Writer, list_checkpoints, load_checkpoint
from ddptui_trainer.loop import padded


def test_agreement_takes_the_newest_point_all_hold_and_one_knows_good():
    assert agree([{"held": [8, 16], "confirmed": 16}, {"held": [8, 16], "confirmed": 8}]) == 16
    # A survivor that never took 16 (it was behind): back to 8.
    assert agree([{"held": [8, 16], "confirmed": 16}, {"held": [0, 8], "confirmed": 8}]) == 8
    # 16 is held everywhere but nobody saw it confirmed: not safe.
    assert agree([{"held": [8, 16], "confirmed": 8}, {"held": [8, 16], "confirmed": 8}]) == 8
    assert agree([{"held": [16], "confirmed": -1}, {"held": [8], "confirmed": 8}]) is None


def test_a_restore_brings_the_tensors_back_and_abandons_the_newer_timeline():
    w = torch.zeros(3)
    snaps = Snapshots([w], cuda=False)
    snaps.take(8, {"global_step": 8})
    w += 1
    snaps.take(16, {"global_step": 16})
    w += 1
    assert snaps.summary() == {"held": [8, 16], "confirmed": 16}
    assert snaps.restore(8) == {"global_step": 8}
    assert torch.equal(w, torch.zeros(3))
    assert snaps.summary()["held"] == [8]


def _served(sampler: ShardedBatchSampler, steps: int | None = None) -> list[int]:
    out = []
    for i, batch in enumerate(sampler):
        if steps is not None and i == steps:
            break
        out += [index for _epoch, index in batch]
    return out


def test_resharding_mid_epoch_serves_every_sample_once():
    n, bs = 300, 4  # 25 steps of 12 on 3 ranks; the 240 left are 30 steps of 8 on 2
    ranks = [ShardedBatchSampler(n, bs, r, 3, seed=1) for r in range(3)]
    seen = []
    for s in ranks:
        seen += _served(s, steps=5)
    for s in ranks:  # five global steps done on every rank
        for _ in range(5):
            s.step_done()
    state = ranks[0].state_dict()
    survivors = [ShardedBatchSampler(n, bs, r, 2, seed=1) for r in range(2)]  # a world of 2
    for s in survivors:
        s.load_state_dict(state)
        seen += _served(s)
    assert sorted(seen) == list(range(n))
    assert ranks[0].progress() < 1.0


def test_progress_is_the_fraction_of_the_epoch_in_any_world():
    s = ShardedBatchSampler(100, 5, 0, 2, max_steps=6)
    for _ in range(3):
        s.step_done()
    assert s.progress() == 0.5  # 3 of the 6 capped steps
    s.set_world(0, 1)  # the cap counts steps, whatever the world size
    assert s.progress() == 0.5


def test_the_event_buffer_drops_the_oldest_and_a_failed_send_goes_back_in_front():
    """Counted by rank: a node's relay holds its ranks' events in one buffer."""
    buf = EventBuffer(limit=3)
    for i in range(5):
        buf.put(Notice(rank=i % 2, level="info", text=str(i)))
    batch, dropped = buf.take()
    assert [e.text for e in batch] == ["2", "3", "4"] and dropped == {0: 1, 1: 1}
    buf.put(Notice(rank=1, level="info", text="5"))
    buf.restore(batch, dropped)  # the send failed: they go first, still bounded
    again, dropped_again = buf.take()
    assert [e.text for e in again] == ["3", "4", "5"] and dropped_again == {0: 2, 1: 1}
    buf.close()
    assert buf.take() is None


def _adamw_parts():
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.BatchNorm1d(3))
    optimizer, _ = build_optimizer(RunConfig(train=TrainOptions(optimizer="adamw")), model, 1, 10)
    return model, optimizer, torch.amp.GradScaler("cpu", enabled=False)


def test_adamw_state_exists_from_the_start_and_rolls_back_with_the_buffers_first():
    model, optimizer, scaler = _adamw_parts()
    tensors = state_tensors(model, optimizer, scaler)
    buffers = buffer_count(model)
    assert buffers == 3  # running mean, var, batches tracked: a forward writes them
    assert tensors[0].data_ptr() == model[1].running_mean.data_ptr()
    # Step count, first and second moments for each of the 4 parameters.
    assert len(tensors) == buffers + 4 + 3 * 4
    snaps = Snapshots(tensors, cuda=False, buffers=buffers)
    snaps.take(0, {"global_step": 0})
    before = [t.clone() for t in tensors]
    model.train()
    model(torch.randn(8, 4)).sum().backward()
    optimizer.step()
    assert not all(torch.equal(a, b) for a, b in zip(before, tensors, strict=True))
    snaps.restore(0)
    assert all(torch.equal(a, b) for a, b in zip(before, tensors, strict=True))


def test_the_writer_announces_a_durable_file_and_reports_a_failed_write(tmp_path):
    announced = []
    writer = Writer(str(tmp_path), lambda path, state: announced.append((path, state["global_step"])))
    state = {"model_name": "m", "optimizer_name": "adamw", "model": {"w": torch.ones(2)},
             "sampler": {"epoch": 1, "steps_done": 3}, "global_step": 13}
    writer.put(state)
    state["model"]["w"] += 1  # the loop goes on: the file keeps the state as it was put
    writer.wait()
    (path,) = list_checkpoints(str(tmp_path))
    assert announced == [(path, 13)] and os.path.basename(path) == "ckpt-e0001-s000003.pt"
    assert torch.equal(load_checkpoint(path, "m", "adamw")["model"]["w"], torch.ones(2))
    with pytest.raises(ValueError, match="made with --optimizer adamw, not sgd"):
        load_checkpoint(path, "m", "sgd")
    half = tmp_path / "half.pt"
    half.write_bytes(open(path, "rb").read()[:1000])
    with pytest.raises(ValueError, match=r"unreadable \(truncated or not a checkpoint\)"):
        load_checkpoint(str(half), "m", "adamw")
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    failing = Writer(str(blocked), lambda path, state: announced.append(path))
    failing.put(state)
    with pytest.raises(OSError):
        failing.wait()
    failing.wait()  # reported once
    assert len(announced) == 1


def _send(conn, order) -> None:
    """An order down a rank's pipe, as the supervisor sends it."""
    conn.send_bytes(encode(order).encode())


def _world(kind, gen: int):
    """A world order of generation `gen` (its members and address matter not here)."""
    return kind(members=[0, 1], gen=gen, init="tcp://127.0.0.1:1")


def test_an_urgent_order_is_published_only_after_the_abort_it_triggers_has_returned():
    """The main thread re-forms the world once it takes the order: the mailbox thread's abort
    of the old world must be over by then (torch's group registry is not thread-safe). The flag
    is up already, so that whatever the abort makes a collective raise is taken for the broken
    world it is, not for the rank's own error."""
    seen_during_abort = []
    aborting, release = threading.Event(), threading.Event()

    def abort() -> None:
        aborting.set()
        release.wait(30)
        seen_during_abort.append((box.has_urgent, box.urgent.empty()))

    ours, supervisor = multiprocessing.Pipe()
    box = Mailbox(OrderPipe(ours))
    box.abort = abort
    _send(supervisor, _world(Recover, 3))
    assert aborting.wait(30)
    assert box.wait_urgent(0.2) is None  # not visible while the abort runs
    release.set()
    assert box.wait_urgent(30) == _world(Recover, 3)
    assert seen_during_abort == [(True, True)]


def test_a_recover_order_while_a_world_forms_cuts_its_store_connections_and_aborts_nothing():
    """A member died before the new world was made: this rank's connections to the world's
    store are cut (a get waiting there for the dead one wakes), nothing else is, and the half
    made world is not aborted (the main thread is registering it). On the store's own rank,
    only once the members met there (it waits for them polling; a request cut under it
    corrupted its heap). A change ordered before the recovery is void; one after is not."""
    store, elsewhere = (socket.create_server(("127.0.0.1", 0)) for _ in range(2))
    ours, supervisor = multiprocessing.Pipe()
    box = Mailbox(OrderPipe(ours))
    aborted = []
    box.abort = lambda: aborted.append(True)
    with box.forming(store.getsockname()[1], own_store=True):
        client = socket.create_connection(store.getsockname())
        server_end, _ = store.accept()
        _send(supervisor, _world(Recover, 4))
        assert box.wait_urgent(30) == _world(Recover, 4)
        client.sendall(b"x")
        assert server_end.recv(1) == b"x"
        box.met()
        bystander = socket.create_connection(elsewhere.getsockname())
        far_end, _ = elsewhere.accept()
        _send(supervisor, _world(Recover, 5))
        assert box.wait_urgent(30) == _world(Recover, 5)
        assert client.recv(1) == b""
        bystander.sendall(b"x")
        assert far_end.recv(1) == b"x"
    assert aborted == []
    _send(supervisor, _world(Recover, 6))
    assert box.wait_urgent(30) == _world(Recover, 6)
    assert aborted == [True]
    assert box.void(_world(Reform, 4)) and not box.void(_world(Reform, 7))
    for s in (store, elsewhere, client, server_end, bystander, far_end):
        s.close()


def test_a_rank_connects_to_the_store_only_once_it_listens():
    """TCPStore's client backs off after a refused connection (0.6 s lost when rank 0 came
    50 ms late): await_store holds the other ranks until the port listens."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    port = server.getsockname()[1]
    returned = threading.Event()
    waiter = threading.Thread(target=lambda: (await_store(f"tcp://127.0.0.1:{port}"),
                                              returned.set()), daemon=True)
    waiter.start()
    assert not returned.wait(0.5)  # bound but not listening: refused, so it waits
    server.listen()
    waiter.join(30)
    assert returned.is_set()
    server.close()
    await_store("env://")  # torchrun's rendezvous: nothing to wait for


@pytest.mark.timeout(60)
def test_a_store_that_died_once_it_listened_is_given_up_on_not_waited_for():
    """Rank 0 died just after its store was seen listening: the member's store client is
    refused from then on, and the death (give_up) ends its wait instead of torch's 30-minute
    timeout. The one probe connection is let in, then the port closes."""
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    dead = threading.Event()

    def die_after_the_probe() -> None:
        listener.accept()[0].close()
        listener.close()
        dead.set()

    threading.Thread(target=die_after_the_probe, daemon=True).start()
    with pytest.raises(WorldLost):
        meet(f"tcp://127.0.0.1:{port}", 1, 2, give_up=dead.is_set)


def test_ranks_get_cuda_defaults_unless_the_user_chose(monkeypatch):
    # Set, then removed: monkeypatch then puts back what the session had, whatever was set here.
    for name in ("CUDA_DEVICE_MAX_CONNECTIONS", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)
    cuda_defaults()
    assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "32"
    assert os.environ["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # e.g. for ordered collectives
    monkeypatch.delenv("PYTORCH_CUDA_ALLOC_CONF")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "max_split_size_mb:128")  # torch's newer name
    cuda_defaults()
    assert os.environ["CUDA_DEVICE_MAX_CONNECTIONS"] == "1"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in os.environ


def test_a_padded_last_validation_batch_scores_its_own_samples_alike():
    from torchvision.models import resnet18

    model = resnet18(num_classes=3).eval().to(memory_format=torch.channels_last)
    images = torch.randn(5, 3, 32, 32).contiguous(memory_format=torch.channels_last)
    grown = padded(images, 8)
    assert grown.shape[0] == 8 and grown.is_contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        torch.testing.assert_close(model(grown)[:5], model(images), rtol=1e-4, atol=1e-5)
    assert padded(images, 4) is images  # a full batch is left alone


def test_the_bad_sample_limit_has_a_floor_on_small_sets():
    """0.1% of a 200-image set is 0: one bad file would end the run. At least 10 are skipped;
    --max-bad-samples 0 still fails at the first."""
    assert DataOptions().bad_sample_limit(200) == 10
    assert DataOptions().bad_sample_limit(1_281_167) == 1281
    assert DataOptions(max_bad_samples=0).bad_sample_limit(1_281_167) == 0


def test_cpu_ranks_fork_their_dataloader_workers():
    """A spawned rank's default start method is spawn: a DataLoader worker would be a fresh
    interpreter importing torch (seconds each). CPU ranks fork them; CUDA ranks start them from
    the preloaded fork server."""
    from ddptui_trainer.pipeline.forkserver import worker_context

    assert worker_context(False).get_start_method() == "fork"
    assert worker_context(True).get_start_method() == "forkserver"


def test_changing_the_worker_count_ends_the_old_workers_at_once():
    """Persistent DataLoader workers end when the settings change or the rank closes its
    loaders, not when the interpreter exits (each one holds a copy of the dataset)."""
    import psutil

    from ddptui_trainer.pipeline.datasets import build_datasets
    from ddptui_trainer.pipeline.loaders import Loaders
    from ddptui_trainer.rank import Rank
    from tests.helpers.runs import TINY, run_config

    config = run_config(*TINY)
    bundle = build_datasets(config, progress=lambda text: None)
    sampler = ShardedBatchSampler(bundle.num_train, 16, 0, 1, max_steps=2)
    me = Rank(slot=0, rank=0, world_size=1, device=torch.device("cpu"), physical_gpu=None,
              reporter=None, echo=False)
    before = {c.pid for c in psutil.Process().children(recursive=True)}

    def workers() -> set[int]:  # this test's: the worker running it may have other children
        return {c.pid for c in psutil.Process().children(recursive=True)} - before

    def wait_gone(pids: set[int]) -> None:
        psutil.wait_procs([psutil.Process(pid) for pid in pids if psutil.pid_exists(pid)],
                          timeout=30)

    loaders = Loaders(config, me, bundle, sampler, {"workers": 1})
    try:
        with contextlib.closing(loaders.train_batches(prefetch=False)) as batches:
            next(batches)
        loaders.arm_val()
        first = workers()
        assert len(first) == 2  # one for training, one for validation
        loaders.apply({"workers": 0})
        wait_gone(first)
        assert not workers()
        assert sum(len(labels) for _, labels in loaders.train_batches(prefetch=False)) == 2 * 16

        loaders.apply({"workers": 1})
        next(iter(loaders.train_batches(prefetch=False)))
        assert len(workers()) == 1
    finally:
        left = workers()
        loaders.close()
    wait_gone(left)
    assert not workers()


def test_cutting_a_worlds_connections_wakes_what_waits_on_them_and_spares_listeners():
    """The sockets opened while a world formed are cut on a recover order: a thread blocked
    reading one wakes at once (as gloo's would), a listening socket and a Unix socket stay."""
    from ddptui.rank.elastic.sockets import open_sockets, sever

    before = open_sockets()
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    server, _ = listener.accept()
    unix_a, unix_b = socket.socketpair()
    world = open_sockets() - before
    got = []
    reader = threading.Thread(target=lambda: got.append(server.recv(10)), daemon=True)
    reader.start()
    assert sever(world) == 2  # the connection's two ends; not the listener, not the Unix pair
    reader.join(10)
    assert got == [b""]
    unix_a.send(b"x")
    assert unix_b.recv(1) == b"x"
    assert listener.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN)
    for s in (listener, client, server, unix_a, unix_b):
        s.close()


def test_process_readings_keep_nothing_of_a_process_that_ended():
    """The readings of a long run's ranks and workers (a new set every epoch and restart)
    drop what ended, so a pid the system reuses is never read as the old process."""
    import subprocess
    import sys

    from ddptui.contract.gpu import ProcessTree

    tree = ProcessTree()
    sleep = [sys.executable, "-c", "import time; time.sleep(60)"]
    alive, ended = subprocess.Popen(sleep), subprocess.Popen(sleep)
    try:
        tree.read(alive.pid)
        tree.read(ended.pid)
        ended.kill()
        ended.wait()
        tree.forget()
        assert set(tree._known) == {alive.pid}
    finally:
        for child in (alive, ended):
            child.kill()
            child.wait()


def test_a_recover_order_fails_a_set_up_waiting_to_accept_and_spares_event_loops_listeners():
    """NCCL's set-up accepts in a polling loop; a member that died before it came leaves it
    waiting there: a recover order while an NCCL world forms shuts the listeners made since,
    which fails it at once. The store's and gloo's listeners sit in event loops, whose thread a
    failed accept would end: kept. A gloo world's forming shuts no listener."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    def accept_as_nccl_does(listener: socket.socket, failed: list) -> None:
        while True:
            try:
                listener.accept()
            except BlockingIOError:
                time.sleep(0.01)
            except OSError as e:
                failed.append(e)
                return

    ours, supervisor = multiprocessing.Pipe()
    box = Mailbox(OrderPipe(ours))
    for nccl in (False, True):
        with box.forming(None, nccl=nccl):
            store = dist.TCPStore("127.0.0.1", 0, 1, is_master=True, wait_for_workers=False)
            gloo = dist.ProcessGroupGloo(dist.PrefixStore("t", store), 0, 1, timedelta(seconds=5))
            listener = socket.create_server(("127.0.0.1", 0))
            listener.setblocking(False)
            failed: list = []
            waiter = threading.Thread(target=accept_as_nccl_does, args=(listener, failed),
                                      daemon=True)
            waiter.start()
            _send(supervisor, _world(Recover, 1))
            assert box.wait_urgent(30) == _world(Recover, 1)
            waiter.join(10 if nccl else 0.5)
        assert bool(failed) is nccl and waiter.is_alive() is not nccl
        store.set("still", "here")
        assert store.get("still") == b"here"
        ones = torch.ones(2)
        gloo.allreduce([ones]).wait()
        assert ones.tolist() == [1.0, 1.0]
        listener.close()
        waiter.join(10)
