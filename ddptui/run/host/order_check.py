"""A dashboard's order, checked against the run it would steer before anything acts: its shape
(contract/dashboards.py), then its meaning and range here. Lives in the run's own process.
"""

from __future__ import annotations

import os

from ddptui.contract.protocol.codec import order_of
from ddptui.contract.protocol.orders import (
    ChangeSettings,
    Order,
    RankOrder,
    RestartGroup,
    Stop,
)
from ddptui.contract.state.source import RunSource
from ddptui.run.host.dashboards import malformed

WORKERS_CAP = 64  # DataLoader workers a rank may be given live, whatever the host
MAX_REQUEST = 64  # characters of a settings request's id


def max_workers() -> int:
    """The host's cores, at least 16 (loaders that wait on storage keep more workers than cores
    busy), at most WORKERS_CAP."""
    return min(WORKERS_CAP, max(16, os.cpu_count() or 1))


def checked(message: dict | None, run: RunSource) -> tuple[Order | None, str | None]:
    """A dashboard's message as the order `run` takes (None), or why it cannot take it."""
    why = malformed(message)
    order = order_of(message) if why is None else None
    if order is None:
        return None, why or "not an order this run takes"
    return order, refusal(order, run)


def refusal(order: Order, run: RunSource) -> str | None:
    """Why `run` cannot take `order` as it is, or None when it can."""
    op, can = order.NAME, run.capabilities
    refused = can.why_not(op)
    if refused:
        return f"{op}: {refused}"
    match order:
        case ChangeSettings():
            return _settings(order)
        case Stop(code=int(code)) if not 0 <= code <= 255:
            return f"stop: exit code {code} is not 0-255"
        case RestartGroup() if not can.restarts_as_group:
            return "restart_group: this run restarts rank by rank, not as a group"
        case RestartGroup(kill=int(kill)) if not _known(kill, run):
            return f"restart_group: there is no rank {kill} to kill"
        case RankOrder() if not _known(order.rank, run):
            return f"{op}: there is no rank {order.rank} in this run"
    return None


def _settings(order: ChangeSettings) -> str | None:
    settings, request = order.settings, order.request
    if not settings:
        return "settings: nothing to change"
    if not 0 < len(request) <= MAX_REQUEST or not request.isprintable():
        return f"settings: a request id is 1-{MAX_REQUEST} printable characters"
    workers = settings.get("workers")
    if workers is not None and not 0 <= workers <= max_workers():
        return f"settings: workers {workers} is not 0-{max_workers()} on this host"
    return None


def _known(rank: int, run: RunSource) -> bool:
    return rank >= 0 and rank in run.state.ranks
