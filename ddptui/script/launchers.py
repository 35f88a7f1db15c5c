"""What a script says of its own launch, read from its source before it runs: whether it starts
its own ranks (mp.spawn, start_processes, multiprocessing.Process, elastic_launch) and whether
its argparse takes torch.distributed.launch's --local-rank.
"""

from __future__ import annotations

import ast
import importlib.util
import os
from dataclasses import dataclass

# The calls that start ranks, by the name they are reached by: the module's last part and the
# function (torch.multiprocessing.spawn, mp.spawn, multiprocessing.Process, ctx.Process, ...).
STARTERS = {"spawn": "torch.multiprocessing.spawn",
            "start_processes": "torch.multiprocessing.start_processes",
            "Process": "multiprocessing.Process", "elastic_launch": "elastic_launch"}
MODULES = ("torch.multiprocessing", "multiprocessing", "torch.distributed.launcher",
           "torch.distributed.launcher.api")
LOCAL_RANK_FLAGS = ("--local-rank", "--local_rank")


@dataclass(frozen=True)
class Launch:
    """Where the script starts its ranks."""

    call: str  # torch.multiprocessing.spawn
    line: int
    path: str

    def said(self, name: str) -> str:
        return (f"{name} starts its own ranks ({self.call}, line {self.line}): ddptui runs it "
                "once and shows each rank it starts")


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


def _tree(path: str | None) -> ast.Module | None:
    if path is None:
        return None
    try:
        with open(path, "rb") as f:
            return ast.parse(f.read(), path)
    except (OSError, SyntaxError, ValueError):
        return None


def starts_ranks(path: str | None) -> Launch | None:
    """The first call in the file that starts ranks, where the file imports what it calls."""
    tree = _tree(path)
    if tree is None:
        return None
    imported = _imports(tree)
    if not imported:
        return None
    for node in ast.walk(tree):
        name = _called(node.func) if isinstance(node, ast.Call) else None
        head, _, last = (name or "").rpartition(".")
        if not head and name in imported:  # from ... import spawn (as sp)
            last = imported[name].rpartition(".")[2]
        if last not in STARTERS:
            continue
        if head in imported:  # mp.spawn, torch.multiprocessing.spawn, multiprocessing.Process
            call = f"{imported[head]}.{last}"
        elif not head and name in imported:
            call = imported[name]
        elif last == "Process" and head:  # ctx.Process: a context of multiprocessing's
            call = "multiprocessing.Process"
        else:
            continue
        return Launch(call, node.lineno, path)
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
        names.update({"torch.multiprocessing": "torch.multiprocessing"})
    return names


def _called(func: ast.expr) -> str | None:
    """`a.b.c` for a call of a.b.c, `ctx.Process` for get_context(...).Process."""
    parts = []
    while isinstance(func, ast.Attribute):
        parts.append(func.attr)
        func = func.value
    if isinstance(func, ast.Name):
        parts.append(func.id)
    elif isinstance(func, ast.Call) and parts:  # mp.get_context("spawn").Process(...)
        parts.append("ctx")
    else:
        return None
    return ".".join(reversed(parts))


def local_rank_flag(path: str | None) -> str | None:
    """The spelling of --local-rank the script's argparse declares (torch.distributed.launch's
    argument), or None."""
    tree = _tree(path)
    if tree is None:
        return None
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                node.func.attr == "add_argument":
            for arg in node.args:
                if isinstance(arg, ast.Constant) and arg.value in LOCAL_RANK_FLAGS:
                    return arg.value
    return None
