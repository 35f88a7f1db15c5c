"""Command-line options declared once, on the dataclass fields they fill: each field of a
configuration section carries its flag and help, and the parsers are generated from them.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any


class Parser(argparse.ArgumentParser):
    """argparse, but a mistake is one line on stderr (no usage dump) and exit code 2; `hints`
    puts a plainer message in the place of one of argparse's own."""

    def __init__(self, *args: Any, hints: dict[str, str] | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.hints = hints or {}

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {self.hints.get(message, message)}\n")


def option(default: Any, help: str | None = None, /, *, flag: str | None = None,
           group: str | None = None, **argparse_kwargs: Any) -> Any:
    """A dataclass field that is also a command-line option: `flag` defaults to the field's name
    with dashes (`batch_size` -> --batch-size); a flag without dashes is positional; `group`
    overrides the section's argument group; the rest goes to `add_argument` as it is (a
    `default` there is the command line's, where it is spelt otherwise than the field's)."""
    return dataclasses.field(default=default, metadata={
        "flag": flag, "help": help, "group": group, "argparse": argparse_kwargs})


def add_sections(parser: argparse.ArgumentParser, *sections: Any) -> dict[str, Any]:
    """Add every option field of `sections` to `parser`, in argument groups titled by each
    section's GROUP class attribute (or a field's own group); returns the groups by title."""
    groups: dict[str, Any] = {}
    for section in sections:
        for f in dataclasses.fields(section):
            if "argparse" not in f.metadata:
                continue  # not an option: set by the launcher
            title = f.metadata["group"] or section.GROUP
            if title not in groups:
                groups[title] = parser.add_argument_group(title)
            flag = _flag(f)
            kwargs = dict(f.metadata["argparse"])
            if f.metadata["help"] is not None:
                kwargs["help"] = f.metadata["help"]
            if flag.startswith("-"):
                # append starts from a fresh list (argparse appends to the default itself)
                kwargs.setdefault("default", None if kwargs.get("action") == "append"
                                  else f.default)
                kwargs["dest"] = _dest(f)
            groups[title].add_argument(flag, **kwargs)
    return groups


def from_args(section: type, parsed: argparse.Namespace, /, **given: Any) -> Any:
    """The section filled from parsed arguments; `given` supplies fields no option sets (or
    overrides one, e.g. --gpus once resolved to indices)."""
    values = {f.name: getattr(parsed, _dest(f)) for f in dataclasses.fields(section)
              if "argparse" in f.metadata and hasattr(parsed, _dest(f))}
    values.update(given)
    return section(**values)


def flags(section: type) -> set[str]:
    """The option flags `section` declares (positionals excluded)."""
    return {_flag(f) for f in dataclasses.fields(section)
            if "argparse" in f.metadata and _flag(f).startswith("-")}


def switches(section: type) -> set[str]:
    """The option flags of `section` that take no value."""
    return {_flag(f) for f in dataclasses.fields(section) if "argparse" in f.metadata
            and f.metadata["argparse"].get("action") in ("store_true", "store_false")}


def _flag(f: dataclasses.Field) -> str:
    return f.metadata["flag"] or "--" + f.name.replace("_", "-")


def _dest(f: dataclasses.Field) -> str:
    return _flag(f).lstrip("-").replace("-", "_")
