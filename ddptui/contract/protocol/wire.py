"""The machinery of the protocol's messages: a frozen dataclass per kind, each field's meaning
declared beside it (`doc`), a registry per family (events by `kind`, orders by `op`, updates by
`type`), and the check that a JSON object's values fit a class's fields (decoding validates).
"""

from __future__ import annotations

import dataclasses
import time
import types
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

W = TypeVar("W", bound="Wire")


def doc(meaning: str, default: Any = dataclasses.MISSING,
        factory: Callable[[], Any] | None = None) -> Any:
    """A field with its meaning (docs/events.md); with no default, the field is required."""
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata={"doc": meaning})
    return dataclasses.field(default=default, metadata={"doc": meaning})


def now() -> float:
    return round(time.time(), 3)


@dataclass(frozen=True, kw_only=True, slots=True)
class Wire:
    """What crosses between ddptui's processes: one JSON object, its family's tag naming the
    class (`kind`, `op` or `type`). A field left at None is not written."""

    TAG: ClassVar[str] = ""
    NAME: ClassVar[str] = ""

    def fields(self) -> dict[str, Any]:
        """Its JSON object, the tag first, without the optional fields left at None."""
        out: dict[str, Any] = {self.TAG: self.NAME}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if value is None and _optional(f):
                continue
            out[f.name] = value
        return out

    def replace(self, **changes: Any) -> Any:
        return dataclasses.replace(self, **changes)


def _optional(f: dataclasses.Field) -> bool:
    return f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


class Family:
    """One family's classes by name, for decoding."""

    def __init__(self, tag: str):
        self.tag = tag
        self.kinds: dict[str, type[Wire]] = {}

    def register(self, name: str) -> Callable[[type[W]], type[W]]:
        def add(cls: type[W]) -> type[W]:
            cls.TAG, cls.NAME = self.tag, name
            self.kinds[name] = cls
            return cls

        return add

    def build(self, obj: dict, base: type[Wire] | None = None) -> Wire | None:
        """The message `obj` holds, its values checked against its class's fields; None for an
        unknown name, a required field missing, a value of the wrong type. Fields the class does
        not have are left out (a log written by another version)."""
        name = obj.get(self.tag)
        cls = self.kinds.get(name) if isinstance(name, str) else None
        if cls is None or base is not None and not issubclass(cls, base):
            return None
        values: dict[str, Any] = {}
        for field, (check, required) in checks(cls).items():
            value = obj.get(field)
            if value is None:
                if required and not (field in obj and check(None)):
                    return None  # missing, or null where it may not be
                if required:
                    values[field] = None
                continue  # an optional field: its default
            if not check(value):
                return None
            values[field] = value
        return cls(**values)


_CHECKS: dict[type, dict[str, tuple[Callable[[Any], bool], bool]]] = {}  # by class, made once


def checks(cls: type) -> dict[str, tuple[Callable[[Any], bool], bool]]:
    """field -> (whether a JSON value fits it, whether it is required)."""
    found = _CHECKS.get(cls)
    if found is None:
        hints = get_type_hints(cls)
        found = _CHECKS[cls] = {f.name: (_fits(hints[f.name]), not _optional(f))
                                for f in dataclasses.fields(cls)}
    return found


def _fits(hint: Any) -> Callable[[Any], bool]:
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        parts = [_fits(h) for h in get_args(hint)]
        return lambda v: any(p(v) for p in parts)
    if origin is Literal:
        allowed = get_args(hint)
        return lambda v: v in allowed
    if hint is type(None):
        return lambda v: v is None
    if hint is float:  # JSON writes 2.0 as 2
        return lambda v: isinstance(v, (int, float)) and not isinstance(v, bool)
    if hint is int:
        return lambda v: isinstance(v, int) and not isinstance(v, bool)
    if hint is bool:
        return lambda v: isinstance(v, bool)
    kind = origin or hint
    return lambda v: isinstance(v, kind)


def type_name(hint: Any, unset_is_absent: bool = False) -> str:
    """A field's type as docs/events.md writes it (an optional field's None is not written)."""
    origin = get_origin(hint)
    if origin in (Union, types.UnionType):
        parts = [h for h in get_args(hint) if not (unset_is_absent and h is type(None))]
        return " or ".join(type_name(h) for h in parts)
    if origin is Literal:
        return " / ".join(f"`{v}`" for v in get_args(hint))
    if hint is type(None):
        return "null"
    return {float: "number", int: "integer", str: "string", bool: "bool", list: "list",
            dict: "object"}.get(origin or hint, getattr(hint, "__name__", str(hint)))
