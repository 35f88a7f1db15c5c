"""Text from ranks and remote peers made safe for a terminal: escape and control sequences never
reach the user's screen raw (a clear-screen or a title change in a message stays inert).
"""

from __future__ import annotations

import re

# Escape sequences: CSI (colours, cursor moves, clearing), OSC (titles, links; BEL or ST ends
# them), and the two-byte ones; then any C0/C1 control character left but tab and newline.
_OSC = r"\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)?"
_CSI = r"\x1b\[[0-?]*[ -/]*[@-~]"
_ESCAPES = re.compile(rf"{_OSC}|{_CSI}|\x1b[@-Z\\-_]?|\x9b[0-?]*[ -/]*[@-~]")
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
_SGR = re.compile(r"\x1b\[[0-9;:]*m")


def plain(text: str) -> str:
    """Every escape sequence and control character removed (tabs become spaces)."""
    return _CONTROLS.sub("", _ESCAPES.sub("", text.replace("\t", "    ")))


def escaped(text: str) -> str:
    """Every control character shown as its escape (\\x1b[2J, not a cleared screen): text that
    names something, a file or a run, kept whole."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def keep_colours(text: str) -> str:
    """Colours (SGR) kept, every other escape and control character removed; \\r and \\n too
    are kept, so progress bars still redraw in place on a terminal."""
    kept: list[str] = []

    def mark(m: re.Match) -> str:
        kept.append(m.group())
        return f"\x00{len(kept) - 1}\x00"

    marked = _SGR.sub(mark, text)
    parts = re.split(r"(\x00\d+\x00|[\r\n])", marked)
    out = []
    for part in parts:
        if part.startswith("\x00") and part.endswith("\x00") and part[1:-1].isdigit():
            out.append(kept[int(part[1:-1])])
        elif part in ("\r", "\n"):
            out.append(part)
        else:
            out.append(plain(part))
    return "".join(out)
