"""The benchmarks people re-run (bench/README.md) still start: each parses `--help` as
`python bench/NAME.py --help` would, so a renamed import or option shows here, not on a GPU machine.
"""

from __future__ import annotations

import glob
import os
import subprocess
import sys

from tests.helpers.runs import ROOT

# One interpreter for all of them (several import torch): each runs as a script would, with its
# own folder first on sys.path and the repository not on it.
EACH_AS_A_SCRIPT = """
import contextlib, io, os, runpy, sys
failed = []
for path in sys.argv[1:]:
    sys.argv, sys.path[0] = [path, "--help"], os.path.dirname(path)
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out):
            runpy.run_path(path, run_name="__main__")
        failed.append(path + ": no --help")
    except SystemExit as e:
        if e.code not in (0, None) or "usage:" not in out.getvalue():
            failed.append(f"{path}: exit {e.code}")
    except Exception as e:
        failed.append(f"{path}: {type(e).__name__}: {e}")
print(failed)
"""


def test_every_benchmark_parses_its_options(tmp_path):
    scripts = [p for p in sorted(glob.glob(os.path.join(ROOT, "bench", "*.py")))
               if not p.endswith("launch_phases.py")]  # it runs only under torchrun
    assert len(scripts) >= 10
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    r = subprocess.run([sys.executable, "-c", EACH_AS_A_SCRIPT, *scripts], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == "[]", r.stdout[-2000:]
