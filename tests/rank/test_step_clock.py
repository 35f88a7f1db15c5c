"""The step clock and its hooks in a rank of its own (a world of one, gloo): the phases a
script's DDP, optimizer and DataLoader mark add up to each step; a comm hook of the script's is
timed and still runs; a built-in one is left alone (the all-reduce wait stays in backward); an
out-of-memory error says its phase and the rank's peak."""

from __future__ import annotations

import subprocess
import sys
import time

from ddptui.rank.telemetry.phases import StepClock
from tests.helpers.runs import ROOT, local_port

RANK = """
import os, sys, torch, torch.distributed as dist
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="{port}")
from ddptui.rank.telemetry.script_watch import watch_everything
windows = []
watch = watch_everything(0, windows.append)
dist.init_process_group("gloo", rank=0, world_size=1)
from torch.nn.parallel import DistributedDataParallel as DDP
model = DDP(torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 4)))
calls = []
if "{hook}" == "mine":
    from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import fp16_compress_hook
    def mine(state, bucket):
        calls.append(1)
        return fp16_compress_hook(state, bucket)
    model.register_comm_hook(None, mine)
elif "{hook}" == "builtin":
    model._register_builtin_comm_hook(dist.BuiltinCommHookType.FP16_COMPRESS)
elif "{hook}" == "late":  # after the first forward (ddptui's own is in by then)
    model(torch.randn(2, 32)).sum().backward()
    def mine(state, bucket):
        calls.append(state)
        from torch.distributed.algorithms.ddp_comm_hooks.default_hooks import allreduce_hook
        return allreduce_hook(state, bucket)
    model.register_comm_hook(None, mine)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.utils.data.TensorDataset(torch.randn(640, 32), torch.randint(0, 4, (640,)))
join = model.join() if "{hook}" == "join" else __import__("contextlib").nullcontext()
with join:
  for x, y in torch.utils.data.DataLoader(data, batch_size=16):
    if "{hook}" == "oom" and len(windows) == 0 and watch.clock.global_step == 5:
        model.register_forward_pre_hook(lambda *_: (_ for _ in ()).throw(
            torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    with torch.no_grad():  # an evaluation's forward: no step's time
        model(x)
if "{hook}" == "copy":  # an EMA's deepcopy, a torch.save of the whole model
    import copy, io
    copy.deepcopy(model.module)
    torch.save(model, io.BytesIO())
watch.flush()
steps = sum(w.steps for w in windows)
comm = sum(w.steps * w.phases["comm"][0] for w in windows)
adds_up = all(abs(sum(v[0] for v in w.phases.values()) - w.step_ms) <= 0.01 * w.step_ms + 0.01
              for w in windows)
print(steps, len(calls), comm > 0, adds_up, windows[-1].measured, calls[-1:] == [None])
"""


def rank(hook: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", RANK.format(port=local_port(), hook=hook)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_the_phases_of_a_scripts_steps_add_up_and_its_all_reduce_is_seen():
    r = rank("none")
    assert r.returncode == 0, r.stderr
    # 40 steps, the first not counted (it began when the clock was made)
    assert r.stdout.split(maxsplit=4)[:4] == ["39", "0", "True", "True"], r.stdout
    assert "'h2d'" not in r.stdout  # a script's own copy: not told apart


def test_a_comm_hook_of_the_scripts_is_timed_and_still_runs():
    r = rank("mine")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:3] == ["39", "40", "True"], r.stdout


def test_a_comm_hook_registered_after_the_first_forward_takes_ddptuis_place():
    """DDP takes one comm hook: ddptui's went in at the first forward; the script's, registered
    after it, runs in its place, with its own state, and is timed."""
    r = rank("late")
    assert r.returncode == 0, r.stderr
    fields = r.stdout.split()
    assert fields[:3] == ["39", "40", "True"] and fields[-1] == "True", r.stdout


def test_join_for_uneven_inputs_and_a_copied_or_saved_model_work_as_without_ddptui():
    for hook in ("join", "copy"):
        r = rank(hook)
        assert r.returncode == 0, (hook, r.stderr[-2000:])
        assert r.stdout.split()[:4] == ["39", "0", "True", "True"], (hook, r.stdout)


def test_a_built_in_comm_hook_is_left_alone():
    r = rank("builtin")
    assert r.returncode == 0, r.stderr
    assert r.stdout.split()[:3] == ["39", "0", "False"], r.stdout


def test_an_out_of_memory_error_says_its_phase_and_the_peak():
    r = rank("oom")
    assert r.returncode == 1
    # (torch.distributed's own hook puts "[rank0]: " before each line of an uncaught error)
    said = r.stderr.index("ddptui: rank 0 ran out of memory in forward (its peak ")
    assert said < r.stderr.index("Traceback"), r.stderr


def test_host_clock_phases_partition_each_step_and_restart_drops_what_is_no_steps():
    windows = []
    clock = StepClock(3, windows.append, every_s=3600)
    clock.step_end()  # the first step is not counted: it began when the clock was made
    for _ in range(3):
        clock.begin("data")
        time.sleep(0.01)
        clock.begin("forward")
        time.sleep(0.02)
        clock.step_end()
    time.sleep(0.05)  # validation
    clock.restart()
    clock.begin("forward")
    clock.step_end()
    clock.flush()
    (w,) = windows
    assert w.rank == 3 and w.steps == 4 and w.clock == "host"
    assert w.phases["data"][0] >= 7.5 and w.phases["forward"][0] >= 15  # means over 4 steps
    assert w.step_ms < 30  # the 50 ms after restart() is nobody's
    assert abs(sum(v[0] for v in w.phases.values()) - w.step_ms) < 0.01
