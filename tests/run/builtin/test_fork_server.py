"""A run's fork server that died and was reaped by another waiter (psutil's, after a kill) is
started anew for the next run in that process, not a ChildProcessError traceback."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.runs import ROOT

AGAIN = """
import os, sys, psutil
from ddptui.run.builtin.helpers import end_helpers, forkserver_pid, start_helpers
start_helpers(sys.argv[1])
first = psutil.Process(forkserver_pid())
first.kill()
psutil.wait_procs([first], timeout=30)  # reaped here, not by multiprocessing
start_helpers(sys.argv[1])
again = forkserver_pid()
print(again != first.pid, psutil.Process(again).status() != psutil.STATUS_ZOMBIE)
end_helpers()
"""


def test_a_fork_server_killed_and_reaped_elsewhere_is_started_again(tmp_path):
    out = subprocess.run([sys.executable, "-c", AGAIN, str(tmp_path / "helpers.out")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True"]
