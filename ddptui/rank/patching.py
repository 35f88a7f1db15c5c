"""Code run right after a module is imported, whoever imports it and however (a spawned child
unpickling its target imports it too): how the injected start-up reaches into a script's torch,
Lightning or Transformers without a line of the script changed.

The standard library alone: every process of a script's run loads it.
"""

from __future__ import annotations

import importlib.abc
import sys
from collections.abc import Callable


def after_import(patches: dict[str, Callable]) -> None:
    """`patches[name](module)` once the module `name` is executed (at once for one imported
    already). A patch that fails says so in one line and leaves the script as it was. One
    finder holds every patch to come: two that wrapped each other's search would never end."""
    patches = dict(patches)
    for name in [n for n in patches if n in sys.modules]:
        _apply(patches.pop(name), sys.modules[name])
    if not patches:
        return
    finder = next((f for f in sys.meta_path if isinstance(f, _Patcher)), None)
    if finder is None:
        finder = _Patcher({})
        sys.meta_path.insert(0, finder)
    for name, patch in patches.items():
        finder.patches.setdefault(name, []).append(patch)


def _apply(patch: Callable, module) -> None:
    try:
        patch(module)
    except Exception as e:  # never the script's failure: it runs as without ddptui
        print(f"ddptui: cannot watch {module.__name__}: {e}", file=sys.stderr)


class _Patcher(importlib.abc.MetaPathFinder):
    def __init__(self, patches: dict[str, list[Callable]]):
        self.patches = patches

    def find_spec(self, name, path, target=None):
        patch = self.patches.get(name)
        if not patch:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _Loader(spec.loader, patch)
                return spec
        return None


class _Loader(importlib.abc.Loader):
    def __init__(self, loader, patch):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        for patch in self._patch:
            _apply(patch, module)

    def __getattr__(self, name):  # get_resource_reader, is_package, ...: the real loader's
        return getattr(self._loader, name)
