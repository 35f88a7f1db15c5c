"""The bytecode cache for environments that forbid writing bytecode (ddptui/contract/bytecode.py): when it
is used, and that the processes a run starts compile into it, never beside the sources."""

from __future__ import annotations

import os
import py_compile
import subprocess
import sys

import pytest

from ddptui.contract import bytecode


@pytest.fixture
def uncompiled(tmp_path, monkeypatch):
    """A package installed without bytecode, in a Python told not to write any."""
    pkg = tmp_path / "site" / "uncompiled_pkg"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("VALUE = 42\n")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.delenv("DDPTUI_PYCACHE", raising=False)
    return pkg


def test_the_cache_is_used_only_where_bytecode_is_missing_and_may_not_be_written(
        uncompiled, monkeypatch):
    probes = ("uncompiled_pkg",)
    assert bytecode.needed(probes)
    monkeypatch.setenv("DDPTUI_PYCACHE", "0")  # the user's opt-out
    assert not bytecode.needed(probes)
    monkeypatch.delenv("DDPTUI_PYCACHE")
    monkeypatch.setattr(sys, "pycache_prefix", "/somewhere/chosen")  # the user's own cache
    assert not bytecode.needed(probes)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # Python writes its own
    assert not bytecode.needed(probes)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    py_compile.compile(str(uncompiled / "__init__.py"), doraise=True)  # compiled at install
    assert not bytecode.needed(probes)
    assert not bytecode.needed(("no_such_package_anywhere",))


def test_a_process_and_its_children_compile_into_the_cache_not_beside_the_sources(
        uncompiled, tmp_path):
    """The parent, and a rank it spawns (multiprocessing passes the parent's -B on to it)."""
    (uncompiled.parent / "rank_like.py").write_text(
        "import sys\n"
        "from ddptui_trainer.bootstrap import write_bytecode_to_the_cache\n"
        "def main():\n"
        "    print(sys.flags.dont_write_bytecode, sys.pycache_prefix, flush=True)\n"
        "    write_bytecode_to_the_cache()\n"
        "    import uncompiled_rank_pkg\n")
    (uncompiled.parent / "uncompiled_rank_pkg.py").write_text("VALUE = 7\n")
    script = (
        "import multiprocessing, subprocess, sys\n"
        "from ddptui.contract import bytecode\n"
        "if __name__ == '__main__':\n"
        "    print(bytecode.enable(), flush=True)\n"
        "    import uncompiled_pkg, rank_like\n"
        "    subprocess.run([sys.executable, '-c', 'import sys; print(sys.pycache_prefix, "
        "sys.dont_write_bytecode)'], check=True)\n"
        "    p = multiprocessing.get_context('spawn').Process(target=rank_like.main)\n"
        "    p.start(); p.join(); sys.exit(p.exitcode)\n")
    (tmp_path / "parent.py").write_text(script)
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1", "DDPTUI_PYCACHE": "1",
           "XDG_CACHE_HOME": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(uncompiled.parent), os.getcwd()])}
    env.pop("PYTHONPYCACHEPREFIX", None)
    out = subprocess.run([sys.executable, str(tmp_path / "parent.py")], env=env,
                         capture_output=True, text=True, check=True, timeout=60).stdout.split("\n")
    cache = str(tmp_path / "cache" / "ddptui" / "pycache")
    assert out[0] == cache
    assert out[1] == f"{cache} False"  # a process started by this one inherits it
    assert out[2] == f"1 {cache}"  # a spawned rank: started with -B, the cache named
    assert not (uncompiled / "__pycache__").exists()
    assert not (uncompiled.parent / "__pycache__").exists()
    compiled = [f for _, _, files in os.walk(cache) for f in files]
    assert any(f.startswith("__init__.") and f.endswith(".pyc") for f in compiled)
    assert any(f.startswith("uncompiled_rank_pkg.") for f in compiled)
