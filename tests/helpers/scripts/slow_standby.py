"""examples/elastic_ddp.py whose standby (r) is slow: it sleeps $STANDBY_WARMS seconds before
ddptui.init() (warming), or $STANDBY_PREPARES after it, in its script's set-up (a joiner
preparing), so that the others can finish the run first."""

import os
import runpy
import sys
import time

import ddptui

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "elastic_ddp.py")
STANDBY = os.environ.get("DDPTUI_STANDBY") == "1"


def init(*args, **kwargs):
    time.sleep(float(os.environ.get("STANDBY_WARMS", 0)) if STANDBY else 0)
    run = _init(*args, **kwargs)
    time.sleep(float(os.environ.get("STANDBY_PREPARES", 0)) if STANDBY else 0)
    return run


_init, ddptui.init = ddptui.init, init
sys.path.insert(0, os.path.dirname(EXAMPLE))
sys.argv[0] = EXAMPLE
runpy.run_path(EXAMPLE, run_name="__main__")
