"""examples/elastic_ddp.py whose standby (r) is killed (SIGKILL, by itself) as its run.elastic()
makes the new world's first group, while the file named by $JOINER_DIES exists: a joiner dead
after it said it is prepared, as the members form the world with it."""

import os
import runpy
import signal
import sys

import torch.distributed as dist

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "elastic_ddp.py")

if os.environ.get("DDPTUI_STANDBY") == "1" and os.path.exists(os.environ["JOINER_DIES"]):
    dist.new_group = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)
sys.path.insert(0, os.path.dirname(EXAMPLE))
sys.argv[0] = EXAMPLE
runpy.run_path(EXAMPLE, run_name="__main__")
