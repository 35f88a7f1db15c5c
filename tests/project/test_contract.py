"""The event and command contract: docs/events.md is what ddptui/contract/schema.py says, the
checker catches an event that breaks it (tests/helpers/runs.py's `events` runs it on every log a
test reads), and every command the dashboard's sources send fits it."""

from __future__ import annotations

import ast
import os
import typing
from pathlib import Path

from ddptui.contract.check import command_problems, problems, reference
from ddptui.contract.events import decode, encode, event
from ddptui.contract.options.config import DeviceOptions, RunConfig
from ddptui.contract.schema import COMMANDS, EVENTS
from ddptui.rank.elastic.agreed import AgreedOrders
from ddptui.run.builtin.supervisor import Supervisor
from tests.helpers.runs import ROOT

DOCS = os.path.join(ROOT, "docs", "events.md")
READERS = ("ev", "item", "cmd", "order", "msg")  # what the code names an event or a command
EMITTERS = ("emit", "_emit", "event")  # what makes one: (kind, [rank,] **fields)


def _fields_read(node: ast.AST) -> list:
    """The key of `ev["key"]` or `ev.get("key", ...)` (any of READERS), or the keys of a
    `case {"key": ...}` pattern."""
    if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) \
            and node.value.id in READERS and isinstance(node.slice, ast.Constant):
        return [node.slice.value]
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
            and node.func.attr == "get" and isinstance(node.func.value, ast.Name) \
            and node.func.value.id in READERS and node.args \
            and isinstance(node.args[0], ast.Constant):
        return [node.args[0].value]
    if isinstance(node, ast.MatchMapping):
        return [key.value for key in node.keys if isinstance(key, ast.Constant)]
    return []


def test_every_field_the_code_reads_of_an_event_or_command_is_declared():
    """A misspelt field fails here, not in front of a user (the next test holds the emitting
    side, and the checker every log the tests read)."""
    declared = set()
    for kind in [*EVENTS.values(), *COMMANDS.values()]:
        declared |= set(typing.get_type_hints(kind))
    root = Path(ROOT)
    reads, unknown = 0, []
    for path in sorted([*root.glob("ddptui/**/*.py"), *root.glob("trainer/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            for key in _fields_read(node):
                reads += 1
                if key not in declared:
                    unknown.append(f"{path.relative_to(root)}:{node.lineno} {key}")
    assert reads > 200 and unknown == []


def test_every_event_the_code_makes_is_a_declared_kind_with_declared_fields():
    """The emitting side, read from the code as the reading side is: `emit("kind", field=...)`,
    `_emit(...)` and `event("kind", rank, field=...)` name a kind and fields of the schema (a
    field passed on in `**fields` is checked on every log the tests read)."""
    root = Path(ROOT)
    calls, unknown = 0, []
    for path in sorted([*root.glob("ddptui/**/*.py"), *root.glob("trainer/**/*.py")]):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Call) and node.args and _called(node) in EMITTERS
                    and isinstance(node.args[0], ast.Constant)):
                continue
            calls += 1
            kind, where = node.args[0].value, f"{path.relative_to(root)}:{node.lineno}"
            if kind not in EVENTS:
                unknown.append(f"{where} {kind}")
                continue
            fields = set(typing.get_type_hints(EVENTS[kind]))
            unknown += [f"{where} {kind}.{kw.arg}" for kw in node.keywords
                        if kw.arg is not None and kw.arg not in fields]
    assert calls > 80 and unknown == []


def _called(call: ast.Call) -> str | None:
    f = call.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def test_docs_events_md_is_generated_from_the_schema():
    with open(DOCS, encoding="utf-8") as f:
        assert f.read() == reference(), \
            "run: python -m ddptui.contract.check > docs/events.md"


def test_the_checker_names_what_breaks_the_contract():
    step = event("step", 0, epoch=0, step=3, global_step=3, loss=None, steps=3,
                 samples_per_s=10.5, step_ms=12, data_wait=0.0)
    assert problems(decode(encode(step))) == []
    assert problems({**step, "loss": "low"}) == ["step: loss='low' is not number or null"]
    assert problems({**step, "lss": 1.0}) == ["step: lss is not in the schema"]
    assert problems({k: v for k, v in step.items() if k != "epoch"}) == ["step: no epoch"]
    assert problems({**step, "kind": "stepp"}) == ["unknown kind 'stepp'"]
    assert problems(event("rank", 1, state="sleepy")) != []
    assert problems(event("rank", 1, state="stalled", waiting_for=[0], cause="x")) == []
    assert problems(event("beat", 0, phase="step", global_step=3, phase_s=0.5)) == []


def test_every_command_the_dashboard_sends_fits_and_the_ranks_serve_each_of_theirs(tmp_path):
    sup = Supervisor(RunConfig(devices=DeviceOptions(cpus=2)), log_path=str(tmp_path / "x.jsonl"))
    sup.pause()
    sup.resume()
    sup.checkpoint()
    sup.change_settings(workers=2, prefetch=False)
    sup.apply_now()
    sup.stop_rank(1)
    sup.restart_rank(1)
    sup.kill_rank(1)
    sup.stacks(0)
    sup.stop()
    sent = list(sup._queued())
    assert [c["op"] for c in sent] == ["pause", "resume", "checkpoint", "settings", "apply",
                                       "stop_rank", "restart_rank", "kill_rank", "stacks", "stop"]
    assert [p for c in sent for p in command_problems(c)] == []
    assert command_problems({"op": "settings", "settings": {}}) == ["settings: no request"]
    # What rank 0 offers every rank is served there (the rest are the parent's own): one set of
    # handlers, the built-in loop's and a script's.
    ranks = [c for c in sent if c["op"] in ("pause", "resume", "checkpoint", "settings", "apply")]
    orders = _Recorded()
    orders.carry_out(ranks[:1])
    assert orders.paused and orders.said == [("run", "paused")]
    orders.carry_out(ranks[1:] + [{"op": "stop"}])
    assert not orders.paused and orders.said[1] == ("run", "resumed")
    assert orders.saved and orders.pending == {"workers": 2, "prefetch": False}
    assert orders.apply_now and orders.stop and orders.interrupted
    orders.carry_out([{"op": "later-version"}])  # ignored, as on every rank


class _Recorded(AgreedOrders):
    """The kit's handlers with hooks that only record."""

    def __init__(self):
        self.said, self.saved, self.pending = [], False, {}
        super().__init__(reporter=self, mailbox=None)

    def emit(self, kind: str, **fields) -> None:
        self.said.append((kind, fields.get("status")))

    def speaks(self) -> bool:
        return True

    def global_step(self) -> int:
        return 7

    def checkpoint(self) -> None:
        self.saved = True

    def settings(self, new: dict, request: str | None) -> None:
        self.pending.update(new)

    def has_pending(self) -> bool:
        return bool(self.pending)

    def stopping(self) -> None:
        pass


def test_the_world_orders_fit():
    from ddptui.run.membership import Membership

    world = Membership([0, 1], lambda: "tcp://127.0.0.1:1")
    orders = [a.order for a in world.stop(1, 0.0) if hasattr(a, "order")]
    assert orders and [p for o in orders for p in command_problems(o)] == []


def test_the_rank_states_the_schema_allows_are_rank_state_s():
    """schema.py cannot import events.py (which imports it): the two lists are kept equal here."""
    from typing import get_args, get_type_hints

    from ddptui.contract.schema import RankEvent
    from ddptui.contract.states import RankState

    state = get_type_hints(RankEvent, include_extras=True)["state"]
    assert get_args(get_args(state)[0]) == tuple(s.value for s in RankState)


def test_a_ranks_heartbeat_fits_the_contract():
    """Beats go to the supervisor's watch only (never the log, which the events checker
    reads): what the heartbeat thread sends is checked here."""
    import threading

    from ddptui.rank.telemetry.heartbeat import Heartbeat, Pulse

    beats, two = [], threading.Event()

    def emit(kind: str, **fields) -> None:
        beats.append(event(kind, 0, **fields))
        if len(beats) >= 2:
            two.set()

    pulse = Pulse()
    pulse.phase, pulse.step = "compute", 3
    beat = Heartbeat(pulse, emit, interval=0.01)
    beat.start()
    assert two.wait(30)
    beat.stop()
    beat.join()
    assert beats and [p for b in beats for p in problems(b)] == []
    assert beats[-1]["phase"] == "compute" and beats[-1]["global_step"] == 3
