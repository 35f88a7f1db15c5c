"""The built-in dataset, made once with progress before the ranks start and race for it, in a
process of its own: the run's process never imports the trainer.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable

from ddptui.contract.options.config import RunConfig


def prepare_data(config: RunConfig, say: Callable[[str], None]) -> None:
    """Generate the built-in dataset once, with progress, before ranks race for it; in a process
    of its own, as the dashboard never imports the trainer."""
    if config.data.kind != "shapes":
        return
    last = 0.0
    with subprocess.Popen([sys.executable, "-m", "ddptui_trainer.pipeline.shapes"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) as p:
        for line in p.stdout:
            done, total = line.split()
            if time.time() - last > 0.5 or done == total:
                last = time.time()
                say(f"generating shapes dataset {done}/{total}")
        error = p.stderr.read().strip()
    if p.returncode != 0:
        raise RuntimeError(f"generating the shapes dataset failed: {error.splitlines()[-1:]}")
