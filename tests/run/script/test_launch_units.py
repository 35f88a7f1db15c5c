"""A script's ranks as the run's process launches and watches them: their environment (the
flight recorder, NCCL's set-up retries), the rendezvous port, GPU ranks told apart and found on one GPU."""

from __future__ import annotations

import pytest


def test_gpu_ranks_get_the_flight_recorder_unless_the_user_routes_its_dumps():
    from ddptui.contract.options.script import ScriptConfig
    from ddptui.run.script.launch import Attempt, rank_env

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
    from ddptui.contract.options.script import ScriptConfig
    from ddptui.run.script.launch import Attempt, rank_env

    attempt = Attempt("id", 0, 29500, "127.0.0.1:1", "k")
    gpu = ScriptConfig(target="t.py", gpus=(0, 1))
    env = rank_env(gpu, attempt, 1, "s", base={})
    tries, sleep = int(env["NCCL_SOCKET_RETRY_CNT"]), int(env["NCCL_SOCKET_RETRY_SLEEP_MSEC"])
    assert sleep * tries * (tries + 1) / 2 < 5000  # NCCL waits a little longer at each try
    mine = rank_env(gpu, attempt, 1, "s", base={"NCCL_SOCKET_RETRY_CNT": "34"})
    assert mine["NCCL_SOCKET_RETRY_CNT"] == "34"
    # The built-in loop's worlds are made abortable; a script's own communicators are not
    # touched (the set-up timeout holds only for the non-blocking ones ddptui forms).
    from ddptui.contract.environment import nccl_defaults

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

    from ddptui.contract.options.script import ScriptConfig
    from ddptui.run.script.watch import ScriptWatch

    said: list[dict] = []
    watch = ScriptWatch(ScriptConfig(target="t.py", gpus=(0, 1)), lambda ev: said.append(ev.fields()),
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


def test_ranks_given_a_gpu_each_that_all_run_on_one_are_found():
    """torch.distributed.launch's scripts under torchrun: every rank took its --local_rank
    default and so GPU 0; a rank that holds memory nowhere yet, or one rank alone, says nothing."""
    from ddptui.run.script.watch import one_gpu

    assert one_gpu({0: {0}, 1: {0}, 2: {0}}) == 0
    assert one_gpu({0: {0}, 1: {1}}) is None
    assert one_gpu({0: {0}, 1: {0, 1}}) is None
    assert one_gpu({0: {0}, 1: set()}) is None
    assert one_gpu({0: {0}}) is None
