"""The run header: what is training where, how far along, how fast, and how well."""

from __future__ import annotations

from rich.text import Text
from textual.reactive import reactive
from textual.widgets import Static

from ddptui.widgets.bars import bar, duration


class RunHeader(Static):
    """Two lines: the job, then progress, time, throughput and best accuracy."""

    view: reactive[dict | None] = reactive(None, layout=False)

    def render(self) -> Text:
        v = self.view
        if v is None:
            return Text("ddptui: starting", style="bold")
        meta = v["meta"]
        world = meta.get("world_size") or len(v["ranks"])
        kind = "GPU" if meta.get("device_kind") == "cuda" else "CPU"
        status = v["status"].upper()
        asked = v.get("pause_asked")
        if status == "RUNNING" and asked is not None and asked != v["paused"]:
            status = "PAUSING" if asked else "RESUMING"  # asked for, not yet agreed by the ranks
        elif status == "RUNNING" and v["paused"]:
            status = "PAUSED"
        line1 = Text.assemble(
            ("ddptui ", "bold"), (f"{meta.get('model', '?')}", "bold cyan"),
            f" · {meta.get('data', '?')} · {world} × {kind} · bs {meta.get('batch_size', '?')}/rank  ",
            (f" {status} ", _status_style(status)))
        epoch, epochs, _step, _steps, done = v["progress"]
        eta = (v["elapsed"] / done - v["elapsed"]) if 0.02 < done < 1 else None
        best = v["best_val_acc"]
        wide = self.size.width >= 100
        line2 = Text.assemble(
            f"epoch {min(epoch + 1, epochs or 1)}/{epochs} ", bar(100 * done, 20 if wide else 8,
                                                                   "cyan"),
            f" {100 * done:3.0f}%  ETA {duration(eta)}  {'elapsed ' if wide else ''}"
            f"{duration(v['elapsed'])}  ", (f"{v['throughput']:,.0f} img/s", "bold"),
            f"  best {'val_acc ' if wide else ''}{'-' if best is None else f'{100 * best:.1f}%'}")
        return Text("\n").join([line1, line2])


def _status_style(status: str) -> str:
    return {"RUNNING": "black on green", "DONE": "black on cyan", "FAILED": "white on red",
            "PAUSED": "black on yellow", "PAUSING": "black on yellow", "RESUMING": "black on green",
            "INTERRUPTED": "black on yellow"}.get(status, "black on white")
