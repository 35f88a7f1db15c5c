"""The events every process sends and reads: their constructors and their codec, one JSON a line.

Events are plain JSON-safe dicts; every one has "t" (unix time), "kind" and "rank" (-1: the parent).
Every kind's fields and their meaning: schema.py (docs/events.md is made from it).
"""

from __future__ import annotations

import json
import math
import time
import uuid

from ddptui.contract.schema import EVENTS

PARENT = -1


def event(kind: str, rank: int, **fields) -> dict:
    """A new event stamped with the current time."""
    return {"t": round(time.time(), 3), "kind": kind, "rank": rank, **fields}


def settings_request(settings: dict, rid: str | None = None) -> tuple[dict, dict]:
    """A settings change as the parent's own "requested" event and the command for rank 0, under
    one id (`rid`, or a new one): rank 0's "pending" echo names it, so a view can tell an echo
    that later keys overtook."""
    rid = rid or uuid.uuid4().hex[:8]
    return (event("settings", PARENT, settings=settings, status="requested", request=rid),
            {"op": "settings", "settings": settings, "request": rid})


def encode(ev: dict) -> str:
    """One JSONL line; NaN/inf (a diverged loss) become null so the line stays valid JSON."""
    clean = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in ev.items()}
    return json.dumps(clean, separators=(",", ":")) + "\n"


def decode(line: str) -> dict | None:
    """Parse one line; None for a blank, malformed or foreign line."""
    try:
        ev = json.loads(line)
    except ValueError:
        return None
    if not isinstance(ev, dict) or ev.get("kind") not in EVENTS \
            or not isinstance(ev.get("rank"), int) or not isinstance(ev.get("t", 0), (int, float)):
        return None
    return ev
