"""Whether a module a user names (`ddptui run -m`, `python -m ddptui.rank.wrap -m`) can be run, said in
one line before anything starts. Imports nothing of ddptui or trainer: the wrapper uses it too.
"""

from __future__ import annotations

import importlib.util


def module_problem(name: str) -> str | None:
    """Why `python -m NAME` could not start, in one line (runpy would raise it with a
    traceback); None when it can. Finding pkg.mod imports pkg, as python -m does."""
    try:
        spec = importlib.util.find_spec(name)
        if spec is not None and spec.submodule_search_locations is not None and \
                importlib.util.find_spec(f"{name}.__main__") is None:
            return f"{name} is a package with no __main__ module to run"
    except ModuleNotFoundError as e:
        if e.name and (name == e.name or name.startswith(e.name + ".")):
            return f"module not found: {name}"  # a package on its path is missing
        return f"module {name} cannot be imported: {type(e).__name__}: {e}"
    except (ImportError, ValueError) as e:
        return f"module {name} cannot be imported: {type(e).__name__}: {e}"
    return f"module not found: {name}" if spec is None else None
