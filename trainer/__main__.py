"""`python -m ddptui_trainer MODEL [options]`: one rank as started by torchrun or srun (or alone).

The rank, world size and rendezvous come from torchrun's or SLURM's environment variables;
without either, it trains as a single-process world.
"""

from __future__ import annotations

import os
import signal
import socket
import sys

from ddptui.contract.environment import cuda_defaults
from ddptui.contract.options.errors import UsageError
from ddptui.contract.options.parser import Parser
from ddptui.contract.options.training import add_training_options, config_from_args
from ddptui.contract.rankspec import RankSpec
from ddptui.rank.stacks import answer_stacks


def distributed_env() -> tuple[int, int, int]:
    """(rank, world size, local rank) from torchrun, else SLURM, else a world of one."""
    env = os.environ
    if "RANK" in env and "WORLD_SIZE" in env:
        return int(env["RANK"]), int(env["WORLD_SIZE"]), int(env.get("LOCAL_RANK", 0))
    if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        rank, world = int(env["SLURM_PROCID"]), int(env["SLURM_NTASKS"])
        if "MASTER_ADDR" not in env or "MASTER_PORT" not in env:
            raise UsageError("under SLURM set MASTER_ADDR and MASTER_PORT (see docs/cluster.md)")
        return rank, world, int(env.get("SLURM_LOCALID", 0))
    env.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in env:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            env["MASTER_PORT"] = str(s.getsockname()[1])
    return 0, 1, 0


def main(argv: list[str] | None = None) -> int:
    parser = Parser(prog="python -m ddptui_trainer",
                    description="Train one DDP rank (run it under torchrun or srun).")
    add_training_options(parser)
    argv = sys.argv[1:] if argv is None else argv
    # `torchrun ... -m ddptui_trainer -- resnet18 --log x`: torchrun's parser rejects a bare --log as an
    # ambiguous prefix of its own --log-dir, so users separate with "--", which may reach us.
    args = parser.parse_args(argv[1:] if argv[:1] == ["--"] else argv)
    if args.report is None:
        args.report = os.environ.get("DDPTUI_REPORT") or None
    try:
        config = config_from_args(args)
        rank, world, local = distributed_env()
    except UsageError as e:
        print(f"python -m ddptui_trainer: error: {e}", file=sys.stderr)
        return 2
    # `kill -USR1 PID` prints every thread's Python stack to stderr: where a hung rank is stuck.
    answer_stacks(signal.SIGUSR1)
    cuda_defaults()
    from ddptui_trainer.rank_main import main as rank_main  # torch is imported only once input is valid

    return rank_main(RankSpec(config, rank, rank, world, local_rank=local, echo=rank == 0))


if __name__ == "__main__":
    sys.exit(main())
