"""Text helpers shared by the widgets: load bars coloured like nvitop's, and compact numbers."""

from __future__ import annotations

from rich.text import Text


def load_style(percent: float) -> str:
    return "green" if percent < 50 else "yellow" if percent < 85 else "red"


def bar(percent: float | None, width: int, style: str | None = None) -> Text:
    """A horizontal bar of `width` cells for 0-100%."""
    if percent is None:
        return Text("·" * width, style="dim")
    filled = round(max(0.0, min(100.0, percent)) / 100 * width)
    text = Text("█" * filled, style=style or load_style(percent))
    text.append("░" * (width - filled), style="dim")
    return text


SPARKS = "▁▂▃▄▅▆▇█"


def spark(values: list[float | None], width: int, lo: float = 0.0, hi: float = 100.0,
          style: str = "cyan") -> Text:
    """The last `width` values as a one-line block sparkline between lo and hi; gaps blank."""
    out = Text(style=style)
    for v in list(values)[-width:]:
        if v is None:
            out.append(" ")
            continue
        frac = 0.0 if hi <= lo else (min(hi, max(lo, v)) - lo) / (hi - lo)
        out.append(SPARKS[round(frac * (len(SPARKS) - 1))])
    return out


def mib(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1024:.1f}G" if value >= 1024 else f"{value}M"


def duration(seconds: float | None) -> str:
    if seconds is None or seconds != seconds or seconds < 0:
        return "--:--"
    seconds = int(seconds)
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m:02d}:{s:02d}"
