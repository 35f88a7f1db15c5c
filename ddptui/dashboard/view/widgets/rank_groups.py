"""The ranks of a job too big for a row a rank: a row a node (its ranks' figures at a glance),
the troubled ranks pinned on top, and the selected rank's node open below its row.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from rich.text import Text

from ddptui.contract.state.views import RankView

GROUP_FROM = 24  # ranks, on several nodes: from here a row a node (3 nodes of 8)
# Worst first: the state a node row shows is the worst of its ranks'.
WORST = ("crashed", "stalled", "unreachable", "waiting", "slow", "restarting", "starting",
         "standby", "stopped", "running", "done")


@dataclass(frozen=True)
class NodeRow:
    """One node's ranks, folded into a row: `open` when the selected rank is one of them."""

    node: str
    ranks: tuple[RankView, ...]
    open: bool

    @property
    def key(self) -> str:
        return f"node:{self.node}"


def grouped(ranks: list[RankView]) -> bool:
    return len(ranks) >= GROUP_FROM and len({r.host for r in ranks}) > 1


def pinned(r: RankView) -> bool:
    """A rank the user is looking for, whatever node it is on."""
    return r.state.is_troubled or r.state == "crashed"


def order(ranks: list[RankView]) -> list[int]:
    """The ranks as up / down go through them: the pinned ones, then node by node."""
    if not grouped(ranks):
        return [r.rank for r in ranks]
    return [r.rank for r in ranks if pinned(r)] + [r.rank for r in ranks if not pinned(r)]


def rows(ranks: list[RankView], selected: int) -> list[RankView | NodeRow]:
    """What the table shows, top to bottom (`ranks` come node by node, as RunView has them)."""
    out: list[RankView | NodeRow] = [r for r in ranks if pinned(r)]
    nodes: dict[str, list[RankView]] = {}
    for r in ranks:
        nodes.setdefault(r.host or "?", []).append(r)
    for node, members in nodes.items():
        rest = [r for r in members if not pinned(r)]
        is_open = any(r.rank == selected for r in rest)
        out.append(NodeRow(node, tuple(members), is_open))
        if is_open:
            out.extend(rest)
    return out


def layout(ranks: list[RankView], selected: int) -> list[RankView | NodeRow]:
    """The table's rows: a row a node where grouped, else a row a rank."""
    return rows(ranks, selected) if grouped(ranks) else list(ranks)


def key(row: RankView | NodeRow) -> str:
    """A row's key in the table."""
    return row.key if isinstance(row, NodeRow) else str(row.rank)


def node_cells(row: NodeRow, columns: tuple[str, ...], styles: dict[str, str]) -> tuple:
    """The node's row in the ranks table's columns: its ranks, the worst state among them (and
    how many are in it), the furthest-behind position, median loss, min / median / max img/s,
    median step time, the most data-wait; nothing where a figure is a single rank's."""
    ranks = row.ranks
    worst = min((r.state for r in ranks), key=lambda s: WORST.index(s) if s in WORST else 99)
    many = sum(r.state == worst for r in ranks)
    behind = min(ranks, key=lambda r: (r.epoch, r.step))
    losses = [r.loss for r in ranks if r.loss is not None]
    rates = sorted(r.samples_per_s for r in ranks if r.samples_per_s and r.state.is_member)
    times = [r.step_ms for r in ranks if r.step_ms and r.state.is_member]
    span = f"{min(r.rank for r in ranks)}-{max(r.rank for r in ranks)}"
    rate = "/".join(_short(x) for x in (rates[0], statistics.median(rates), rates[-1])) \
        if rates else "-"
    cells = {"rank": f"{'▾' if row.open else '▸'} {row.node}",
             "state": Text(f"{worst} {many}/{len(ranks)}", style=styles.get(worst, "")),
             "epoch/step": f"{behind.epoch}/{behind.step}",
             "loss": f"{statistics.median(losses):.4f}" if losses else "-",
             "img/s": rate, "samples/s": rate,
             "step ms": f"{statistics.median(times):.1f}" if times else "-",
             "wait": f"{100 * max(r.data_wait for r in ranks):.0f}%",
             "device": f"ranks {span}"}
    return tuple(cells.get(c, "") for c in columns)


def _short(x: float) -> str:
    """2,900 -> '2.9k': three figures fit one column."""
    return f"{x / 1000:.1f}k" if x >= 1000 else f"{x:.0f}"
