"""examples/elastic_ddp.py whose standby (r), once it has its join order, prepares for ever (its
script's set-up after ddptui.init() never ends), and whose members wait before epoch 2 until it
has begun: the run ends while the joiner prepares, whatever the machine's speed. The flag is the
file named by $PREPARING."""

import os
import runpy
import sys
import time

import ddptui

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "elastic_ddp.py")
FLAG = os.environ["PREPARING"]


def init(*args, **kwargs):
    run = _init(*args, **kwargs)
    if os.environ.get("DDPTUI_STANDBY") == "1":  # returns with the join order: it prepares
        open(FLAG, "w").close()
        time.sleep(3600)
    epochs = run.epochs

    def waiting(n, sampler=None, start=0):
        for epoch in epochs(n, sampler, start):
            while epoch == 2 and not os.path.exists(FLAG):
                time.sleep(0.1)
            yield epoch

    run.epochs = waiting
    return run


_init, ddptui.init = ddptui.init, init
sys.path.insert(0, os.path.dirname(EXAMPLE))
sys.argv[0] = EXAMPLE
runpy.run_path(EXAMPLE, run_name="__main__")
