"""examples/elastic_ddp.py whose model carries 16 M frozen parameters (64 MB that no step
touches): a joiner takes a tenth of a second or more to receive and load its state, as a real
model's would, so its own `running` report comes in well after the world formed with it."""

import os
import runpy
import sys

import torch
import torch.nn as nn

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "elastic_ddp.py")
sys.path.insert(0, os.path.dirname(EXAMPLE))
import plain_ddp  # noqa: E402 (the example's own module, found beside it)

small = plain_ddp.model


def model(classes: int) -> nn.Module:
    net = small(classes)
    net.ballast = nn.Parameter(torch.zeros(16 << 20), requires_grad=False)
    return net


plain_ddp.model = model
sys.argv[0] = EXAMPLE
runpy.run_path(EXAMPLE, run_name="__main__")
