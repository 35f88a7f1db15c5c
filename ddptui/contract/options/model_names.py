"""torchvision's classification model names, read from its source files without importing it,
so that a name is checked (and an unknown one refused) before torch loads.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re

# A builder in torchvision/models/*.py: `@register_model()`, perhaps more decorators, its def.
_BUILDER = re.compile(r"^@register_model\([^)]*\)\s*\n(?:@.*\n)*def (\w+)\(", re.MULTILINE)


@functools.cache
def classifier_names() -> tuple[str, ...]:
    """The names `torchvision.models.list_models(module=torchvision.models)` gives, sorted; the
    detection, segmentation, video and quantized builders live in subpackages and are left out,
    as there."""
    spec = importlib.util.find_spec("torchvision")
    if spec is None or not spec.submodule_search_locations:
        return ()
    folder = os.path.join(spec.submodule_search_locations[0], "models")
    names = set()
    for entry in os.scandir(folder):
        if entry.name.endswith(".py") and entry.is_file():
            with open(entry.path, encoding="utf-8") as f:
                names.update(_BUILDER.findall(f.read()))
    return tuple(sorted(names))
