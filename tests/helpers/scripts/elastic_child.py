"""examples/elastic_ddp.py whose ranks each start a child that outlives them (sleep 600 holding
the rank's output open), as a DataLoader worker does until its next check of its parent."""

import os
import runpy
import subprocess
import sys

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "..", "examples", "elastic_ddp.py")

subprocess.Popen(["sleep", "600"])
sys.path.insert(0, os.path.dirname(EXAMPLE))
sys.argv[0] = EXAMPLE
runpy.run_path(EXAMPLE, run_name="__main__")
