"""Why a rank is slow, from the phases of its steps: the straggler and the phase that makes it
one (with the GPU's clocks or the input workers where they explain it), the ranks that wait for
it in all-reduce, a whole world slower than its own best, and memory that grows epoch by epoch.

Pure: the ranks' figures in, lines out (`Finding`s), for the live screen and the end's report.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from ddptui.contract.protocol.steptime import PHASES
from ddptui.contract.state.steptime import RankTimes
from ddptui.contract.state.views import DeviceView, RunView

SLOW = 1.15  # a rank's own time (its step less its wait for the others) over the others' median
MIN_EXCESS_MS = 1.0  # ... and by at least this much: a 2 ms step's jitter is nobody's fault
WAITS = 0.2  # a share of the step in all-reduce worth naming
DATA = 0.1  # a share of the step waiting for input worth naming
BEHIND_BEST = 1.15  # every rank this much slower than its own best window
CREEP_EPOCHS = 3  # the memory peak grew in each of the last this many epochs ...
CREEP_MIB = 16.0  # ... by at least this much (and 0.5% of the peak)
LABELS = {"data": "data-wait", "h2d": "host-to-device copy", "forward": "forward",
          "backward": "backward", "comm": "all-reduce wait", "optimizer": "optimizer",
          "rest": "rest"}


@dataclass(frozen=True)
class Finding:
    """One line of the verdict; `rank` None for the whole world."""

    kind: str  # slow | waits | data | behind_best | memory
    rank: int | None
    text: str
    fields: dict


def judge(ranks: dict[int, RankTimes], gpus: dict[int, DeviceView] | None = None,
          settings: dict | None = None) -> list[Finding]:
    """Every finding the ranks' latest windows and memory support, the straggler first."""
    now = {slot: fig for slot, r in ranks.items() if (fig := r.now()) is not None}
    found = stragglers(now, gpus or {}, settings or {})
    culprit = found[0].rank if found else None
    found += waits(now, culprit) + data_waits(now, settings or {}, found)
    found += behind_best(ranks, now)
    found += [f for slot, r in sorted(ranks.items()) if (f := memory_creep(slot, r))]
    return found


def untold(measured: list[str]) -> list[str]:
    """The phases a rank cannot tell apart (their time is in rest), as the screen names them."""
    return [LABELS[p] for p in PHASES if p not in measured]


def own_ms(fig: tuple[float, dict]) -> float:
    """A rank's own time a step: all of it but its wait for the others in all-reduce."""
    return fig[0] - fig[1].get("comm", 0.0)


def stragglers(now: dict[int, tuple[float, dict]], gpus: dict[int, DeviceView],
               settings: dict) -> list[Finding]:
    """Ranks whose own time is SLOW x the others' median, slowest first, each with the phase
    that makes the difference."""
    if len(now) < 2:
        return []
    found = []
    own = sorted((own_ms(fig), slot) for slot, fig in now.items())  # once: 512 ranks a second
    values = [ms for ms, _ in own]
    for i, (mine, slot) in enumerate(own):
        median = _median_without(values, i)
        if median <= 0 or mine < SLOW * median or mine - median < MIN_EXCESS_MS:
            continue
        fig = now[slot]
        others = [f for s, f in now.items() if s != slot]
        phase, excess, base = _worst_phase(fig[1], [f[1] for f in others])
        # +22% where the others spend time in that phase too, else the milliseconds it adds
        more = f"+{excess / base:.0%}" if base >= 0.05 * median and excess < 9 * base else \
            f"+{excess:,.1f} ms a step"
        cause = _cause(phase, gpus.get(slot), settings)
        text = (f"rank {slot}: {slower(mine / median)} than the median; its "
                f"{LABELS[phase]} {more}" + (f": {cause}" if cause else ""))
        found.append(Finding("slow", slot, text, {
            "slower": round(mine / median - 1, 4), "phase": phase, "own_ms": round(mine, 3),
            "median_ms": round(median, 3), "excess_ms": round(excess, 3), "cause": cause}))
    if len(found) == len(now):  # everyone is slower than everyone: nobody is
        return []
    return sorted(found, key=lambda f: -f.fields["slower"])


def _median_without(ordered: list[float], i: int) -> float:
    """The median of the sorted `ordered` less its i-th value, without a copy of it."""
    m = len(ordered) - 1

    def at(j: int) -> float:
        return ordered[j] if j < i else ordered[j + 1]

    return at(m // 2) if m % 2 else (at(m // 2 - 1) + at(m // 2)) / 2


def slower(ratio: float) -> str:
    """'14% slower', or '3.2x slower' past double."""
    return f"{ratio - 1:.0%} slower" if ratio < 2 else f"{ratio:.1f}x slower"


def _worst_phase(mine: dict, others: list[dict]) -> tuple[str, float, float]:
    """(phase, its excess over the others' median in ms, that median)."""
    best = ("rest", 0.0, 0.0)
    for phase, ms in mine.items():
        if phase == "comm":
            continue
        base = statistics.median(o.get(phase, 0.0) for o in others)
        if ms - base > best[1]:
            best = (phase, ms - base, base)
    return best


def gpus_of(view: RunView) -> dict[int, DeviceView]:
    """Each rank's GPU as the run last read it (a CPU rank has none)."""
    devices = {d.key: d for d in view.devices}
    return {r.rank: d for r in view.ranks if r.gpu is not None and (
        d := devices.get(f"{r.node} gpu{r.gpu}" if r.node else f"gpu{r.gpu}")) is not None}


def _cause(phase: str, gpu: DeviceView | None, settings: dict) -> str:
    if phase in ("forward", "backward", "optimizer") and gpu is not None:
        name = gpu.key.replace("gpu", "GPU ")
        if gpu.held_down:
            clock = f" at {gpu.sm_clock:,} MHz" if gpu.sm_clock else ""
            return f"{name} held{clock} by {', '.join(map(str, gpu.held_down))}"
        if gpu.others:
            return f"{name} shared with {len(gpu.others)} other process" + (
                "es" if len(gpu.others) > 1 else "")
    if phase == "data" and "workers" in settings:
        return f"{settings['workers']} DataLoader workers"
    if phase == "rest":
        return "the loop's own code between the phases"
    return ""


def waits(now: dict[int, tuple[float, dict]], culprit: int | None) -> list[Finding]:
    """Ranks that spend WAITS of their step in all-reduce, and whom for."""
    found = []
    for slot, (step, means) in sorted(now.items()):
        share = means.get("comm", 0.0) / step if step else 0.0
        if share < WAITS or slot == culprit:
            continue
        whom = f": for rank {culprit}" if culprit is not None else " (not hidden by backward)"
        found.append(Finding("waits", slot, f"rank {slot} waits {share:.0%} of its step in "
                             f"all-reduce{whom}", {"share": round(share, 4), "for": culprit}))
    return found


def data_waits(now: dict[int, tuple[float, dict]], settings: dict,
               said: list[Finding]) -> list[Finding]:
    """Ranks that wait DATA of their step for input (where no straggler line says so)."""
    named = {f.rank for f in said if f.fields.get("phase") == "data"}
    found = []
    for slot, (step, means) in sorted(now.items()):
        share = means.get("data", 0.0) / step if step else 0.0
        if share < DATA or slot in named:
            continue
        workers = f" ({settings['workers']} DataLoader workers)" if "workers" in settings else ""
        found.append(Finding("data", slot, f"rank {slot}: data-wait {share:.0%} of its step"
                             f"{workers}", {"share": round(share, 4)}))
    return found


def behind_best(ranks: dict[int, RankTimes], now: dict[int, tuple[float, dict]]) -> list[Finding]:
    """Every rank BEHIND_BEST slower than its own best window: something that slows them all
    (thermals, a noisy neighbour, a slower shard of the input), with the phase that grew."""
    pairs = {s: (now[s], r.best) for s, r in ranks.items() if s in now and r.best is not None}
    if not pairs or len(pairs) < len(now):
        return []
    ratios = [fig[0] / best[0] for fig, best in pairs.values() if best[0] > 0]
    if not ratios or min(ratios) < BEHIND_BEST:
        return []
    grew: dict[str, float] = {}
    for fig, best in pairs.values():
        for phase, ms in fig[1].items():
            grew[phase] = grew.get(phase, 0.0) + ms - best[1].get(phase, 0.0)
    if not grew:
        return []
    phase = max(grew, key=lambda p: grew[p])
    step = statistics.median(fig[0] for fig, _ in pairs.values())
    best_ms = statistics.median(best[0] for _, best in pairs.values())
    who = "every rank is" if len(pairs) > 1 else f"rank {next(iter(pairs))} is"
    return [Finding("behind_best", None, f"{who} {slower(min(ratios))} than its own best "
                    f"({step:,.1f} ms a step against {best_ms:,.1f} ms); most of it in "
                    f"{LABELS[phase]}", {"slower": round(min(ratios) - 1, 4), "phase": phase})]


def memory_creep(slot: int, r: RankTimes) -> Finding | None:
    """A rank whose memory peak grew in each of its last CREEP_EPOCHS epochs (minutes, where it
    names none): how fast, and when it runs out at that rate."""
    epochs = [r.epoch_peaks[k] for k in sorted(r.epoch_peaks)]
    if len(epochs) <= CREEP_EPOCHS:
        return None
    last = epochs[-CREEP_EPOCHS - 1:]
    growth = [b[0] - a[0] for a, b in zip(last, last[1:], strict=False)]
    floor = max(CREEP_MIB, 0.005 * last[-1][0])
    if min(growth) < floor:
        return None
    rate = sum(growth) / len(growth)
    spans = [e[2] - e[1] for e in epochs[:-1] if e[2] > e[1]]
    epoch_min = statistics.median(spans) / 60 if spans else None
    limit, peak = r.memory.get("limit"), last[-1][0]
    span = "a minute" if r.by_minute else "an epoch"
    text = f"rank {slot}: memory peak +{rate:,.0f} MiB {span}"
    minutes = None
    if limit and epoch_min:
        minutes = max(0.0, (limit - peak) / rate * epoch_min)
        text += f": out of memory in about {_duration(minutes)} at this rate"
    elif limit and r.by_minute:
        minutes = max(0.0, (limit - peak) / rate)
        text += f": out of memory in about {_duration(minutes)} at this rate"
    return Finding("memory", slot, text, {"mib_per_epoch": round(rate, 1), "peak": peak,
                                          "limit": limit, "minutes_left": minutes})


def _duration(minutes: float) -> str:
    if minutes < 1:
        return "under a minute"
    if minutes < 120:
        return f"{minutes:.0f} minutes"
    return f"{minutes / 60:.0f} hours"
