"""Compiled bytecode where the environment forbids writing it: a cache of ddptui's own.

Container images often set PYTHONDONTWRITEBYTECODE=1 and install packages uncompiled; every rank
then compiles torch and torchvision from source at each start (docs/benchmarks.md, start-up).
"""

from __future__ import annotations

import importlib.util
import os
import sys

# The packages whose start-up matters: the ranks' and the dashboard's.
PROBES = ("torch", "torchvision", "textual")


def cache_dir() -> str:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "ddptui", "pycache")


def needed(probes: tuple[str, ...] = PROBES) -> bool:
    """Not where the user chose a bytecode directory (PYTHONPYCACHEPREFIX); DDPTUI_PYCACHE=1
    or 0 decides; otherwise: Python may not write bytecode and an installed package in `probes`
    has none next to its source."""
    choice = os.environ.get("DDPTUI_PYCACHE")
    if sys.pycache_prefix or choice == "0":
        return False
    if choice == "1":
        return True
    if not sys.dont_write_bytecode:
        return False
    for name in probes:
        try:
            spec = importlib.util.find_spec(name)
        except (ImportError, ValueError):
            continue
        origin = spec.origin if spec else None
        if origin and origin.endswith(".py") and \
                not os.path.exists(importlib.util.cache_from_source(origin)):
            return True
    return False


def enable() -> str | None:
    """Where needed: this process and every process it starts (ranks, their workers' fork
    server) read and write bytecode under the cache directory, never beside the sources.
    Returns the directory, or None."""
    if not needed():
        return None
    path = cache_dir()
    try:
        os.makedirs(path, exist_ok=True)
    except OSError:  # an unwritable home: start-up stays as slow as it was
        return None
    sys.pycache_prefix, sys.dont_write_bytecode = path, False
    os.environ["PYTHONPYCACHEPREFIX"] = path
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    return path
