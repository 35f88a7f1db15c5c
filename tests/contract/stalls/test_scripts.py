"""Stall verdicts on ranks seen from outside: stopped, idle or silent for the whole limit, and
who waits for whom in a collective. No process is started."""

from __future__ import annotations

from ddptui.contract.stalls.scripts import Reading, ScriptStalls, blame, blocked_in_collective


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


def test_a_stopped_rank_is_the_culprit_without_stacks():
    in_allreduce = _stacks(("/x/torch/distributed/distributed_c10d.py", "all_reduce"),
                           ("train.py", "main"))
    assert blame({0: in_allreduce}, frozen={1}) == {0: ("all_reduce", [1])}


SITE = "/venv/lib/python3.11/site-packages"


def test_a_collective_is_recognised_wherever_it_is_called_from():
    """DDP's buffer broadcast in its forward, a library's all-reduce, FSDP's: waiting. A rank in
    its own code (asleep in its forward under DDP, in its dataset under the DataLoader) is not."""
    ddp = f"{SITE}/torch/nn/parallel/distributed.py"
    module = f"{SITE}/torch/nn/modules/module.py"
    in_buffers = _stacks((ddp, "_distributed_broadcast_coalesced"), (ddp, "_default_broadcast_coalesced"),
                         (ddp, "_sync_module_buffers"), (ddp, "_pre_forward"), (ddp, "forward"),
                         (module, "_call_impl"), (f"{SITE}/timm/train.py", "train_one_epoch"),
                         ("/home/u/train.py", "main"))
    assert blocked_in_collective(in_buffers) == "_distributed_broadcast_coalesced (DDP)"
    in_lightning = _stacks((f"{SITE}/torch/distributed/distributed_c10d.py", "all_reduce"),
                           (f"{SITE}/lightning/fabric/utilities/distributed.py", "_sync_ddp"),
                           ("/home/u/train.py", "validation_step"))
    assert blocked_in_collective(in_lightning) == "all_reduce"
    asleep_in_forward = _stacks(("/home/u/train.py", "forward"), (module, "_call_impl"),
                                (ddp, "_run_ddp_forward"), (ddp, "forward"),
                                ("/home/u/train.py", "main"))
    assert blocked_in_collective(asleep_in_forward) is None
    a_library_model_inside_fsdp = _stacks((f"{SITE}/timm/models/resnet.py", "forward"),
                                          (module, "_call_impl"),
                                          (f"{SITE}/torch/distributed/fsdp/api.py", "forward"))
    assert blocked_in_collective(a_library_model_inside_fsdp) is None
    waiting_for_input = _stacks(("/usr/lib/python3.11/threading.py", "wait"),
                                (f"{SITE}/torch/utils/data/dataloader.py", "_get_data"),
                                ("/home/u/train.py", "main"))
    assert blocked_in_collective(waiting_for_input) is None
