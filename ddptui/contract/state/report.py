"""The verdict at the end of a run, and `ddptui report`: where the time went per rank and
overall, the slowest rank and why, input wait, memory peaks, restarts, stalls and the settings
that were live; as figures (`--json`) and as the lines printed after the run's exit line.

Pure: a run view and its step times in, a dict and lines out.
"""

from __future__ import annotations

from ddptui.contract.protocol.events import PARENT
from ddptui.contract.protocol.steptime import PHASES, Verdict
from ddptui.contract.safe_text import plain
from ddptui.contract.state.runstate import RunState
from ddptui.contract.state.steptime import RankTimes
from ddptui.contract.state.verdicts import LABELS, gpus_of, judge, untold
from ddptui.contract.state.views import RunView
from ddptui.contract.wording import count


def run_report(state: RunState, logged: bool = True) -> tuple[dict, list[str]]:
    """The run's verdict: (`logged`) the one it left in its log, else one made now from what it
    has seen (a run still going, a log cut short; the figures of a log's verdict, which anyone
    may have written, are never taken as they are)."""
    with state.lock:
        book = state.steptimes
        verdict, ranks, states = book.verdict, book.copy(), dict(book.states)
    if verdict is not None and logged:
        return verdict.report, [plain(str(line)) for line in verdict.lines]
    report = build_report(state.view(), ranks, states)
    return report, report_lines(report)


def verdict_event(state: RunState) -> Verdict:
    """The verdict as the event the run leaves in its log, just before its end."""
    report, lines = run_report(state, logged=False)
    return Verdict(rank=PARENT, report=report, lines=lines)


def build_report(view: RunView, ranks: dict[int, RankTimes], states: dict[str, int]) -> dict:
    """The run's verdict as figures (the `verdict` event's `report`)."""
    epochs = [e for e in view.epochs if not e["partial"] or e["at_quit"]]
    rates = [e["samples_per_s"] for e in view.epochs if e["samples_per_s"] is not None]
    totals: dict[str, float] = {}
    for r in ranks.values():
        for phase, ms in r.total_ms.items():
            totals[phase] = totals.get(phase, 0.0) + ms
    whole = sum(totals.values())
    steps = sum(r.steps for r in ranks.values())
    measured = sorted({p for r in ranks.values() for p in r.measured}, key=PHASES.index)
    findings = judge(_whole_run(ranks), gpus_of(view), view.settings)
    return {
        "run": view.meta.get("model") or view.meta.get("script") or "",
        "log": view.meta.get("log"), "status": view.status, "exit_code": view.exit_code,
        "seconds": round(view.elapsed, 1), "ranks": len(view.ranks),
        "epochs": [{k: e[k] for k in ("epoch", "train_loss", "val_loss", "val_acc",
                                      "samples_per_s", "data_wait", "seconds", "partial")}
                   for e in epochs],
        "samples_per_s": round(sum(rates) / len(rates), 2) if rates else None,
        "step_ms": round(whole / steps, 3) if steps else None,
        "phases": {p: round(totals.get(p, 0.0) / whole, 4) for p in measured} if whole else {},
        "measured": measured,
        "per_rank": {str(slot): _rank(r) for slot, r in sorted(ranks.items())},
        "slowest": next(({"rank": f.rank, "text": f.text, **f.fields} for f in findings
                         if f.kind == "slow"), None),
        "findings": [f.text for f in findings],
        "memory_peak": max((r.memory.get("peak") or 0 for r in ranks.values()), default=None),
        "restarts": sum(r.restarts for r in view.ranks),
        "stalls": states.get("stalled", 0), "crashes": states.get("crashed", 0),
        # As the last row ran them (a CPU run's prefetch is n/a), else as they are now.
        "settings": dict(view.epochs[-1]["settings"] if view.epochs else view.settings),
    }


def _rank(r: RankTimes) -> dict:
    return {"steps": r.steps, "step_ms": round(sum(r.total_ms.values()) / r.steps, 3)
            if r.steps else None, "phases": {p: round(s, 4) for p, s in r.shares().items()},
            "clock": r.clock, "memory": dict(r.memory)}


def _whole_run(ranks: dict[int, RankTimes]) -> dict[int, RankTimes]:
    """Each rank as if its whole run were one window: the end's verdict is the run's, not
    its last seconds'."""
    out = {}
    for slot, r in ranks.items():
        if not r.steps:
            continue
        means = {p: ms / r.steps for p, ms in r.total_ms.items()}
        whole = RankTimes(measured=r.measured, clock=r.clock, memory=r.memory,
                          epoch_peaks=r.epoch_peaks)
        whole.recent.append((r.steps, sum(means.values()), means))
        whole.best = r.best  # a run that fell behind its own best says so at its end too
        out[slot] = whole
    return out


def report_lines(report: dict) -> list[str]:
    """The verdict as it is printed after the run's exit line."""
    rate = f", {report['samples_per_s']:,.0f} img/s" if report["samples_per_s"] else ""
    lines = [f"verdict: {report['run'] or 'the run'} {report['status']} after "
             f"{report['seconds']:,.1f} s on {count(report['ranks'], 'rank')}: "
             f"{count(len(report['epochs']), 'epoch')}{rate}"]
    if report["phases"]:
        lines.append(f"  where the time went ({report['step_ms']:,.1f} ms a step): " +
                     shares_text(report["phases"]))
        left = untold(report["measured"])
        if left:
            lines.append(f"  not told apart here (in rest): {', '.join(left)}")
        for slot, r in report["per_rank"].items():
            if r["step_ms"] is not None:
                lines.append(f"  rank {slot}: {r['step_ms']:,.1f} ms a step: " +
                             shares_text(r["phases"]) + _peak(r["memory"]))
    else:
        lines.append("  no phases were measured (no DDP model's step was seen, or "
                     "DDPTUI_STEP_CLOCK=0)")
    lines.append("  slowest: " + (report["slowest"]["text"] if report["slowest"] else
                                  "no rank stood out"))
    lines += [f"  {text}" for text in report["findings"] if text != (report["slowest"] or
                                                                     {}).get("text")]
    lines.append(f"  restarts {report['restarts']}, stalls {report['stalls']}, crashes "
                 f"{report['crashes']}; settings: " + (", ".join(
                     f"{k} {_setting(v)}" for k, v in report["settings"].items()) or "-"))
    return lines


def shares_text(shares: dict[str, float]) -> str:
    return " · ".join(f"{LABELS[p]} {s:.0%}" for p, s in shares.items() if p in LABELS)


def _peak(memory: dict) -> str:
    if not memory.get("peak"):
        return ""
    kind = "GPU memory" if memory.get("kind") == "cuda" else "resident memory"
    return f"; {kind} peak {memory['peak']:,.0f} MiB"


def _setting(value) -> str:
    return {True: "on", False: "off"}.get(value, str(value)) if isinstance(value, bool) \
        else str(value)
