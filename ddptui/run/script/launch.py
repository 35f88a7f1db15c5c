"""What one rank of a script is started with: torchrun --standalone's environment (so Lightning,
Accelerate and the script itself take it for torchrun), ddptui's hooks, and its command line.
"""

from __future__ import annotations

import os
import sys
import uuid
from dataclasses import dataclass

from ddptui.contract.environment import nccl_defaults, with_inject
from ddptui.contract.observe.flight import trace_env
from ddptui.contract.observe.vitals import phases_path, vitals_path
from ddptui.contract.options.script import ScriptConfig


@dataclass(frozen=True)
class Attempt:
    """One start of the whole group (torchrun restarts every rank together)."""

    run_id: str
    restart: int  # TORCHELASTIC_RESTART_COUNT
    master_port: int
    report: str  # HOST:PORT of the parent's listener, for ddptui.init()
    key: str  # the per-run key of that listener


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


# --no-python: the program replaces a small python that first ties it to ddptui's life (the
# death signal outlives exec) and makes it the parent that ddptui's sitecustomize looks for, so
# that a python it starts (`python train.py` in a shell script) is armed as the rank.
_EXEC = ("import ctypes, os, sys\n"
         "if sys.platform.startswith('linux'): ctypes.CDLL(None).prctl(1, 9)\n"
         "if os.getppid() != int(os.environ['DDPTUI_PARENT']): sys.exit(1)\n"
         "os.environ['DDPTUI_PARENT'] = str(os.getpid())\n"
         "os.execvp(sys.argv[1], sys.argv[1:])")


def command(config: ScriptConfig, rank: int = 0) -> list[str]:
    """`python -u script.py args` or `python -u -m module args`, with this interpreter; with
    --no-python, `script args` itself. A script written for torch.distributed.launch gets its
    `--local_rank=N` first, as launch passed it."""
    if config.no_python:
        return [sys.executable, "-c", _EXEC, config.target, *config.args]
    target = ["-m", config.target] if config.module else [config.target]
    local = [f"{config.local_rank_flag}={rank}"] if config.local_rank_flag else []
    return [sys.executable, "-u", *target, *local, *config.args]


def described(config: ScriptConfig) -> str:
    """The command line as the user gave it, after the options."""
    return " ".join([*(["-m"] if config.module else []), config.target, *config.args])


def rank_env(config: ScriptConfig, attempt: Attempt, rank: int, stacks_path: str,
             base: dict | None = None, trace_prefix: str | None = None,
             error_file: str = "", ranks: tuple[str, str] | None = None,
             door: str | None = None) -> dict[str, str]:
    """The environment of rank `rank`: torchrun's variables (`error_file`: where torch's
    @record writes the rank's exception), the GPUs in --gpus order, what ddptui's
    sitecustomize and ddptui.init() read, and on GPUs the NCCL flight recorder with its dump
    pipe under `trace_prefix` (unless the user points it elsewhere). `ranks`: (the run's rank
    socket, the stem of the ranks' files) where the process may start ranks of its own; a
    script that does (config.launch) gets none of torchrun's variables, as when run plainly.
    `door`: the run's rank socket, where a rank says that it turns out to start ranks of its
    own (config.relaunch: the script is then started again as their launcher)."""
    env = dict(os.environ if base is None else base)
    n = config.world_size
    env.update(_torchrun(config, attempt, rank, error_file))
    env.update({
        "PYTHONUNBUFFERED": "1",
        "PYTHONPATH": with_inject(env.get("PYTHONPATH")),
        "DDPTUI_PARENT": str(os.getpid()),
        "DDPTUI_STACKS": stacks_path,
        "DDPTUI_VITALS": vitals_path(stacks_path),
        "DDPTUI_STACKS_SIGNAL": str(config.stacks_signal),
        "DDPTUI_REPORT": attempt.report,
        "DDPTUI_AUTHKEY": attempt.key,
    })
    if ranks is not None:
        env["DDPTUI_RANKS"], env["DDPTUI_RANKS_STEM"] = ranks
    if door and config.relaunch and not config.launch:  # it may turn out to launch: said there
        env["DDPTUI_RELAUNCH"] = door
    if env.get("DDPTUI_STEP_CLOCK", "1") != "0":  # (off: to measure what it costs)
        env["DDPTUI_PHASES"] = phases_path(stacks_path)
    env.pop("DDPTUI_AUTHKEY_FILE", None)
    if n > 1:
        env.setdefault("OMP_NUM_THREADS", "1")  # as torchrun: N processes on one host's cores
    if config.gpus:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # nvidia-smi's order, as --gpus names them
        env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, config.gpus))
        nccl_defaults(env)  # a run.elastic() survivor of a death inside NCCL's set-up
        if trace_prefix and not {"TORCH_NCCL_DEBUG_INFO_PIPE_FILE", "TORCH_FR_DUMP_TEMP_FILE",
                                 "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"} & set(env):
            env.update(trace_env(trace_prefix, env))
    else:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _torchrun(config: ScriptConfig, attempt: Attempt, rank: int, error_file: str) -> dict:
    """torchrun --standalone's variables for rank `rank`; none for a launcher."""
    if config.launch:
        return {}
    n = config.world_size
    return {
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(n),
        "LOCAL_WORLD_SIZE": str(n), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
        "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(n), "ROLE_NAME": "default",
        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(attempt.master_port),
        "TORCHELASTIC_RUN_ID": attempt.run_id,
        "TORCHELASTIC_RESTART_COUNT": str(attempt.restart),
        "TORCHELASTIC_MAX_RESTARTS": str(config.max_restarts),
        # torchrun's agent hosts the store; here rank 0 does, as with a plain env:// launch.
        "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_ERROR_FILE": error_file,
    }
