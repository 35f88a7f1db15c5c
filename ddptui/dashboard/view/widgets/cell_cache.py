"""Table cells rendered once for what they show: a DataTable renders every visible cell anew
after any one changed; the ranks table takes those that show what they showed from here."""

from __future__ import annotations

from collections.abc import Callable, Hashable

from rich.text import Text


class CellCache:
    """A table's cells rendered, by what they show and where: DataTable renders every visible
    cell anew after any one changed (its cache counts the table's updates), which at 512 ranks
    was 80 ms a refresh; cells that show what they showed are taken from here."""

    def __init__(self, limit: int = 4096):
        self.limit = limit
        self._lines: dict[tuple, list] = {}

    def get(self, key: tuple, render: Callable[[], list]) -> list:
        lines = self._lines.get(key)
        if lines is None:
            if len(self._lines) >= self.limit:  # a long run's old figures: start again
                self._lines.clear()
            lines = self._lines[key] = render()
        return lines


def shown_as(value) -> Hashable:
    """A cell's value as a key: what it draws, with its styles."""
    if isinstance(value, Text):
        return (value.plain, value.style, tuple(value.spans), value.overflow, value.no_wrap,
                value.justify, value.end)
    return value if isinstance(value, Hashable) else repr(value)
