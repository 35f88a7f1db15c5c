"""examples/elastic_ddp.py whose standby (r) fails in its set-up, before its process group,
while the file named by $JOINER_FAILS exists: a joiner's script crashing while the others train."""

import os
import runpy
import sys

import ddptui

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "elastic_ddp.py")


def init(*args, **kwargs):
    run = _init(*args, **kwargs)
    if os.environ.get("DDPTUI_STANDBY") == "1" and os.path.exists(os.environ["JOINER_FAILS"]):
        raise FileNotFoundError("the dataset is not there")
    return run


_init, ddptui.init = ddptui.init, init
sys.path.insert(0, os.path.dirname(EXAMPLE))
sys.argv[0] = EXAMPLE
runpy.run_path(EXAMPLE, run_name="__main__")
