"""What a dashboard may send a run's process (contract/protocol/orders.py: FROM_DASHBOARDS), and
the check of its shape that every order passes before it is decoded; its meaning and range are
checked in order_check.py.
"""

from __future__ import annotations

from ddptui.contract.protocol.orders import FROM_DASHBOARDS
from ddptui.contract.protocol.wire import checks

BY_OP = {cls.NAME: cls for cls in FROM_DASHBOARDS}
SETTINGS = {"prefetch": bool, "workers": int, "cudnn_benchmark": bool}
# What a dashboard must say that the run's own order may leave out: how the run ends.
REQUIRED = {"stop": ("code",)}


def malformed(order: dict | None) -> str | None:
    """Why a dashboard's message is not an order a run takes, in one line; None when it is."""
    if order is None:
        return "not a JSON object"
    op = order.get("op")
    cls = BY_OP.get(op) if isinstance(op, str) else None
    if cls is None:
        return f"unknown op {str(op)[:40]!r}"
    for name, (fits, required) in checks(cls).items():
        value = order.get(name)
        if value is None and not required and name not in REQUIRED.get(str(op), ()):
            continue
        if value is None and not required or not fits(value) or isinstance(value, bool):
            return f"{op}: bad {name}"  # no field of an order is a flag
    settings = order.get("settings", {})
    if any(type(v) is not SETTINGS.get(k) for k, v in settings.items()):
        return "settings: unknown name or bad value"
    return None
