"""What a script says of its own launch, read from its source before it runs: whether it starts
its own ranks (mp.spawn, start_processes, multiprocessing.Process, elastic_launch) and whether
its argparse takes torch.distributed.launch's --local-rank.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
from dataclasses import dataclass

# The calls that start ranks (torch.multiprocessing.spawn, mp.spawn, multiprocessing.Process,
# a context's Process, elastic_launch), by their last name, from the modules that have them.
STARTERS = frozenset({"spawn", "start_processes", "Process", "elastic_launch"})
MODULES = ("torch.multiprocessing", "multiprocessing", "torch.distributed.launcher",
           "torch.distributed.launcher.api")
LOCAL_RANK_FLAGS = ("--local-rank", "--local_rank")
_IN_USE = re.compile(r"EADDRINUSE|address already in use", re.I)
_PORT = re.compile(r"\bport:? (\d+)")


@dataclass(frozen=True)
class Launch:
    """Where the script starts its ranks."""

    call: str  # torch.multiprocessing.spawn
    line: int

    def found(self, name: str) -> str:
        return f"{name} starts its own ranks ({self.call}, line {self.line})"

    def said(self, name: str) -> str:
        return f"{self.found(name)}: ddptui runs it once and shows each rank it starts"


def source_of(target: str, module: bool) -> str | None:
    """The file a script or `-m` module runs, without importing it (None: not to be had)."""
    if not module:
        return target if target.endswith(".py") and os.path.isfile(target) else None
    try:
        spec = importlib.util.find_spec(target)
    except (ImportError, ValueError):
        return None
    origin = spec.origin if spec else None
    return origin if origin and origin.endswith(".py") else None


def parse(path: str | None) -> ast.Module | None:
    """The file's syntax tree, read once for both questions below (None: no file, or not
    Python ddptui can read)."""
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None


def starts_ranks(tree: ast.Module | None) -> Launch | None:
    """The first call in the file that starts ranks, through a module it imports for that."""
    if tree is None:
        return None
    imported = _imports(tree)
    contexts = _contexts(tree, imported)
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func, name = node.func, _dotted(node.func)
        head, _, last = (name or "").rpartition(".")
        if isinstance(func, ast.Attribute) and (_is_context(func.value, imported) or
                                                _dotted(func.value) in contexts):
            call = f"multiprocessing.{func.attr}"  # ctx.Process, mp.get_context(...).Process
        elif not head and name in imported:  # from ... import spawn (as sp)
            call = imported[name]
        elif head in imported:  # mp.spawn, torch.multiprocessing.spawn, multiprocessing.Process
            call = f"{imported[head]}.{last}"
        else:
            continue
        if call.rpartition(".")[2] in STARTERS:
            return Launch(call, node.lineno)
    return None


def _imports(tree: ast.Module) -> dict[str, str]:
    """Local names of the launching modules and functions the file imports -> their full name."""
    names: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in MODULES or a.name == "torch":
                    names[a.asname or a.name] = a.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            for a in node.names:
                full = f"{node.module}.{a.name}"
                if full in MODULES or node.module in MODULES and a.name in STARTERS:
                    names[a.asname or a.name] = full
    if "torch" in names:  # torch.multiprocessing.spawn(...) through `import torch`
        names["torch.multiprocessing"] = "torch.multiprocessing"
    return names


def _is_context(node: ast.expr, imported: dict[str, str]) -> bool:
    """`mp.get_context(...)` of an imported multiprocessing module."""
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
        node.func.attr == "get_context" and _dotted(node.func.value) in imported


def _contexts(tree: ast.Module, imported: dict[str, str]) -> set[str]:
    """Names the file binds to a multiprocessing context (ctx = mp.get_context("spawn"))."""
    return {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
            and _is_context(node.value, imported)
            for t in node.targets if isinstance(t, ast.Name)}


def _dotted(node: ast.expr) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def collided(error: str, copies: int, command: str) -> str | None:
    """What to say when one of `copies` copies of a script failed on a port in use: they may
    each start the same ranks on one fixed port (mp.spawn's tcp://127.0.0.1:23456)."""
    if copies < 2 or not _IN_USE.search(error):
        return None
    port = _PORT.search(error)
    return (f"{copies} copies of the script collided on port {port[1] if port else 'a port'}: "
            "a script that starts its own ranks (mp.spawn) runs once: ddptui run "
            f"--nproc-per-node 1 {command}")


def local_rank_flag(tree: ast.Module | None) -> str | None:
    """The spelling of --local-rank the script's argparse declares (torch.distributed.launch's
    argument), or None."""
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and arg.value in LOCAL_RANK_FLAGS:
                    return arg.value
    return None
