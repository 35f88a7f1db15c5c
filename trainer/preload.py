"""What the fork server that ddptui's ranks are forked from imports (ddptui/run/builtin/processes.py):
every module a rank needs before its first step, imported once per run instead of once per rank.
"""

from ddptui_trainer.bootstrap import write_bytecode_to_the_cache

write_bytecode_to_the_cache()  # the server, as each rank did, fills ddptui's bytecode cache

import torch._dynamo  # noqa: E402,F401  DDP's constructor and the optimizers import it
import torchvision.models  # noqa: E402,F401

import ddptui.rank.elastic.world  # noqa: E402,F401
import ddptui_trainer.rank_main  # noqa: E402,F401
