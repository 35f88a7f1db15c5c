"""Your state as run.elastic() keeps it: its tensors taken out of the nested dicts, lists and
tuples your state function returns, and put back into that structure again.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch


class Slot:
    """Where a tensor was in your state (an index into the points' tensors)."""

    def __init__(self, index: int):
        self.index = index


def take_out(obj: Any, tensors: list[torch.Tensor]) -> Any:
    """`obj` with each tensor replaced by its Slot (appended to `tensors`); the rest copied."""
    if isinstance(obj, torch.Tensor):
        tensors.append(obj)
        return Slot(len(tensors) - 1)
    if isinstance(obj, dict):
        return type(obj)((k, take_out(v, tensors)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(take_out(v, tensors) for v in obj)
    return copy.deepcopy(obj)


def map_slots(obj: Any, fn: Callable[[Slot], Any]) -> Any:
    """`obj` with fn(slot) in each Slot's place."""
    if isinstance(obj, Slot):
        return fn(obj)
    if isinstance(obj, dict):
        return type(obj)((k, map_slots(v, fn)) for k, v in obj.items())
    if isinstance(obj, (list, tuple)):
        return type(obj)(map_slots(v, fn) for v in obj)
    return obj


def put_back(skeleton: Any, tensors: list[torch.Tensor]) -> Any:
    return map_slots(skeleton, lambda slot: tensors[slot.index])


def alike(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.shape == y.shape and x.dtype == y.dtype and
                                    x.device == y.device for x, y in zip(a, b, strict=False))
