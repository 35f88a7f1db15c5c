"""A run state as one JSON-able dict and back: what a dashboard that attaches to a running run
is handed, so it draws an hour-long run at once instead of folding the hour's events again.
"""

from __future__ import annotations

from collections import deque
from dataclasses import fields

from ddptui.contract.protocol.codec import event_of
from ddptui.contract.state.epochs import EpochRow
from ddptui.contract.state.runstate import RunState
from ddptui.contract.state.steptime import StepTimes
from ddptui.contract.state.timeline import Recent, Timeline
from ddptui.contract.state.views import CHANGES, HEAT_POINTS, DeviceView, RankView
from ddptui.contract.states import RankState

# Plain fields, copied as they are (JSON keeps their types).
PLAIN = ("meta", "status", "paused", "pause_asked", "started_t", "first_step_t", "ended_t",
         "settings", "pending", "asked", "best_val_acc", "seq", "exit_code", "reason", "last_t",
         "checkpoint_t", "host")


def dump(state: RunState) -> dict:
    """The state's every field (the caller holds `state.lock`)."""
    out = {name: getattr(state, name) for name in PLAIN}
    out["ranks"] = [_rank(r) for r in state.ranks.values()]
    out["devices"] = [_device(d) for d in state.devices.values()]
    out["epochs"] = [[list(key), {**vars(row), "ranks": [[rank, ev.fields()] for rank, ev in
                                                         row.ranks.items()]}]
                     for key, row in state.epochs.items()]
    out["loss_lines"] = [[rank, vars(line)] for rank, line in state.loss_lines.items()]
    out["loss_band"] = {name: vars(line) for name, line in state.loss_band.lines.items()}
    out["rate_line"], out["wait_line"] = vars(state.rate_line), vars(state.wait_line)
    out["marks"] = list(state.marks)
    out["lines"] = list(state.lines)
    out["rank_said"] = list(state.rank_said.items())
    out["live_epoch"] = state.live_epoch.now
    out["steptimes"] = state.steptimes.dump()
    return out


def load(data: dict, live: bool = True) -> RunState:
    """A RunState equal to the one `data` was dumped from."""
    state = RunState(live=live)
    for name in PLAIN:
        setattr(state, name, data[name])
    for r in data["ranks"]:
        r = dict(r)
        steps = deque(r["step_times"], maxlen=r.pop("step_times_max"))
        changes = deque(((t, RankState.of(s), why) for t, s, why in r["changes"]),
                        maxlen=CHANGES)
        line = deque((tuple(p) for p in r["step_line"]), maxlen=HEAT_POINTS)
        view = RankView(**{**r, "state": RankState.of(r["state"]), "step_times": steps,
                           "changes": changes, "step_line": line})
        state.ranks[view.rank] = view
    for d in data["devices"]:
        history = Recent(d["history"]["seconds"], d["history"]["limit"])
        history.rows.extend(tuple(row) for row in d["history"]["rows"])
        device = DeviceView(**{**d, "history": history})
        state.devices[device.key] = device
    for key, row in data["epochs"]:
        ranks = {rank: event_of(ev) for rank, ev in row["ranks"]}
        state.epochs[tuple(key)] = EpochRow(**{**row, "ranks": {rank: ev for rank, ev in
                                                                ranks.items() if ev}})
    for rank, line in data["loss_lines"]:
        state.loss_lines[rank] = _timeline(line)
    for name, line in data.get("loss_band", {}).items():  # a run's process of before the band
        state.loss_band.lines[name] = _timeline(line)
    state.rate_line, state.wait_line = _timeline(data["rate_line"]), _timeline(data["wait_line"])
    state.marks.extend(tuple(m) for m in data["marks"])
    state.lines.extend(tuple(line) for line in data["lines"])
    state.rank_said = dict(data["rank_said"])
    state.live_epoch.now = data["live_epoch"]
    if "steptimes" in data:  # a run's process of before the phases
        state.steptimes = StepTimes.load(data["steptimes"])
    return state


def _rank(r: RankView) -> dict:
    out = {f.name: getattr(r, f.name) for f in fields(r)}
    out["state"] = r.state.value
    out["step_times"], out["step_times_max"] = list(r.step_times), r.step_times.maxlen
    out["changes"] = [[t, s.value, why] for t, s, why in r.changes]
    out["step_line"] = list(r.step_line)
    return out


def _device(d: DeviceView) -> dict:
    out = {f.name: getattr(d, f.name) for f in fields(d)}
    history: Recent = d.history  # type: ignore[assignment]
    out["history"] = {"seconds": history.seconds, "limit": history.rows.maxlen,
                      "rows": list(history.rows)}
    return out


def _timeline(data: dict) -> Timeline:
    line = Timeline(data["capacity"])
    line.__dict__.update(data)
    line.points = [tuple(p) for p in data["points"]]
    return line
