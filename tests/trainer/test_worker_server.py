"""The fork server a CUDA rank's DataLoader workers start from never carries the CUDA sanitizer:
torch imported with it there starts CUDA, and every worker forked after failed on an H100."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers.runs import ROOT

SERVER_ENV = """
from multiprocessing import forkserver
from ddptui_trainer.pipeline.forkserver import start_worker_server
import os
start_worker_server()
pid = forkserver._forkserver._forkserver_pid
print(os.environ.get("TORCH_CUDA_SANITIZER"))
print("TORCH_CUDA_SANITIZER=" in open(f"/proc/{pid}/environ").read())
"""


def test_the_workers_fork_server_starts_without_the_sanitizer():
    out = subprocess.run([sys.executable, "-c", SERVER_ENV], cwd=ROOT, capture_output=True,
                         text=True, timeout=120,
                         env={"PATH": "/usr/bin:/bin", "TORCH_CUDA_SANITIZER": "1"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["1", "False"]  # the rank keeps it; its workers' server not
