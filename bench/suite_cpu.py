"""Where the suite's CPU goes: pytest run as `make test` runs it, each test's CPU-seconds (the
worker's own, and what the processes it reaped took), summed by file, as Markdown tables.

    python bench/suite_cpu.py --top 20 [-- PYTEST_ARGS]

A test is charged with the children its worker waited for while it ran: a `--detach`ed run's
ranks, and the built-in loop's fork server (it lives as long as its worker), are not in its row,
so the rows add up to a little less than `/usr/bin/time make test` says. Compare two trees on one
machine, one after the other: a shared 2-core machine's figures move with the day.
"""

from __future__ import annotations

import argparse
import collections
import os
import resource
import subprocess
import sys
import tempfile
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TSV = "SUITE_CPU_TSV"  # where the workers append a row per test; set only by this driver


def _cpu() -> tuple[float, float]:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, kids.ru_utime + kids.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item):
    """Loaded with -p suite_cpu in each worker: a row per test."""
    if not os.environ.get(TSV):
        yield
        return
    (own0, kids0), t0 = _cpu(), time.monotonic()
    yield
    (own1, kids1), wall = _cpu(), time.monotonic() - t0
    with open(os.environ[TSV], "a") as f:  # one short write per row: the workers' rows stay whole
        f.write(f"{item.nodeid}\t{own1 - own0:.2f}\t{kids1 - kids0:.2f}\t{wall:.1f}\n")


def tables(rows: list[tuple[str, float, float, float]], top: int) -> str:
    """By file (tests, CPU-s, of it the worker's own), then the `top` costliest tests."""
    files: dict[str, list[float]] = collections.defaultdict(lambda: [0, 0.0, 0.0])
    for node, own, kids, _ in rows:
        f = files[node.split("::")[0]]
        f[0] += 1
        f[1] += own + kids
        f[2] += own
    out = ["| file | tests | CPU-s | the worker's own |", "|---|---|---|---|"]
    for name, (n, cpu, own) in sorted(files.items(), key=lambda kv: -kv[1][1]):
        out.append(f"| {name} | {n} | {cpu:.1f} | {own:.1f} |")
    out.append(f"| all | {len(rows)} | {sum(r[1] + r[2] for r in rows):.1f} | "
               f"{sum(r[1] for r in rows):.1f} |")
    out += ["", "| test | CPU-s | wall s |", "|---|---|---|"]
    for node, own, kids, wall in sorted(rows, key=lambda r: -(r[1] + r[2]))[:top]:
        out.append(f"| {node} | {own + kids:.1f} | {wall:.1f} |")
    return "\n".join(out)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--top", type=int, default=20, help="how many of the costliest tests to list")
    p.add_argument("--workers", type=int, default=3, help="pytest -n, as make test runs it")
    p.add_argument("pytest_args", nargs="*", help="after --: more for pytest (a path, -k)")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        tsv = os.path.join(tmp, "tests.tsv")
        bench = os.path.dirname(os.path.abspath(__file__))
        env = dict(os.environ, PYTHONHASHSEED="0", **{TSV: tsv},
                   PYTHONPATH=os.pathsep.join(filter(None, [bench, os.environ.get("PYTHONPATH")])))
        t0 = time.monotonic()
        code = subprocess.call([sys.executable, "-m", "pytest", "-q", "-n", str(args.workers),
                                "--dist", "worksteal", "-p", "suite_cpu", *args.pytest_args],
                               cwd=ROOT, env=env)
        wall = time.monotonic() - t0
        with open(tsv) as f:
            rows = [(n, float(o), float(k), float(w)) for n, o, k, w in
                    (line.rstrip("\n").split("\t") for line in f)]
    total = resource.getrusage(resource.RUSAGE_CHILDREN)
    print(f"\npytest exit {code}; {total.ru_utime + total.ru_stime:.1f} CPU-s in all "
          f"({total.ru_utime:.1f} user + {total.ru_stime:.1f} sys), {wall:.0f} s wall\n")
    print(tables(rows, args.top))
    sys.exit(code)


if __name__ == "__main__":
    main()
