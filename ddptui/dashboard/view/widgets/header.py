"""The run header: what is training where, how far along, how fast, and how well."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from ddptui.contract.state.views import RunView
from ddptui.dashboard.view.widgets.bars import bar, duration


class RunHeader(Static):
    """Two lines: the job, then progress, time, throughput and best accuracy."""

    view: reactive[RunView | None] = reactive(None, layout=False)
    read_only: reactive[bool] = reactive(False)  # a dashboard that may only watch (ddptui web)

    def render(self) -> Text:
        v = self.view
        if v is None:
            return Text("ddptui: starting", style="bold")
        meta = v.meta
        world = meta.get("world_size") or len(v.ranks)
        kind = "GPU" if meta.get("device_kind") == "cuda" else "CPU"
        status = v.status.upper()
        asked = v.pause_asked
        if status == "RUNNING" and asked is not None and asked != v.paused:
            status = "PAUSING" if asked else "RESUMING"  # asked for, not yet agreed by the ranks
        elif status == "RUNNING" and v.paused:
            status = "PAUSED"
        badge = Text.assemble("  ", (" read-only ", "bold black on yellow")) \
            if self.read_only else Text()
        if meta.get("script"):
            line1, *rest = self._script(v, meta, world, kind, status)
            return Text("\n").join([line1 + badge, *rest])
        line1 = Text.assemble(
            ("ddptui ", "bold"), (f"{meta.get('model', '?')}", "bold cyan"),
            f" · {meta.get('data', '?')} · {world} × {kind} · bs {meta.get('batch_size', '?')}/rank  ",
            (f" {status} ", _status_style(status)))
        done = v.progress.done
        eta = (v.elapsed / done - v.elapsed) if 0.02 < done < 1 else None
        best = v.best_val_acc
        wide = self.size.width >= 100
        line2 = Text.assemble(
            f"{v.progress.where} ", bar(100 * done, 20 if wide else 8, "cyan"),
            f" {100 * done:3.0f}%  ETA {duration(eta)}  {'elapsed ' if wide else ''}"
            f"{duration(v.elapsed)}  ", (f"{v.throughput:,.0f} img/s", "bold"),
            f"  best {'val_acc ' if wide else ''}{'-' if best is None else f'{100 * best:.1f}%'}")
        return Text("\n").join([line1 + badge, line2])


    def _script(self, v: RunView, meta: dict, world: int, kind: str, status: str) -> list[Text]:
        """A script's run: what was launched, and what its output and processes tell."""
        restart = f" · restart {meta['restart']}" if meta.get("restart") else ""
        line1 = Text.assemble(("ddptui ", "bold"), (meta["script"], "bold cyan"),
                              f" · {world} × {kind}{restart}  ", (f" {status} ",
                                                                  _status_style(status)))
        printing = [r for r in v.ranks if r.loss is not None]
        losses = [r.loss for r in printing]
        counting = [r for r in v.ranks if r.iteration]  # a script that names no epochs
        where = f"step {max(r.step for r in counting)}" if counting else v.progress.where
        parts = [where if v.epochs or losses else "no figures printed yet",
                 f"elapsed {duration(v.elapsed)}"]
        if losses:  # most scripts print on rank 0 alone
            whose = f"rank {printing[0].rank}" if len(losses) == 1 else "mean of ranks" \
                if len(losses) == len(v.ranks) else f"mean of {len(losses)} ranks"
            parts.append(f"loss {sum(losses) / len(losses):.4f} ({whose})")
        if v.throughput:
            parts.append(f"{v.throughput:,.0f} samples/s")
        elif counting and counting[0].steps_per_s:
            parts.append(f"{counting[0].steps_per_s:.1f} it/s")
        if v.best_val_acc is not None:
            parts.append(f"best val_acc {100 * v.best_val_acc:.1f}%")
        return [line1, Text("  ".join(parts))]


def _status_style(status: str) -> str:
    return {"RUNNING": "black on green", "DONE": "black on cyan", "FAILED": "white on red",
            "PAUSED": "black on yellow", "PAUSING": "black on yellow", "RESUMING": "black on green",
            "INTERRUPTED": "black on yellow"}.get(status, "black on white")
