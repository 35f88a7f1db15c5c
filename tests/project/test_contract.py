"""The protocol as code: docs/events.md is what contract/protocol/ says, the one codec checks what
it decodes (tests/helpers/runs.py's `events` decodes every log a test reads) and reads the logs
of earlier releases, every order a dashboard and the run send goes through it whole, and no code
outside contract/protocol/ writes an event or an order as a dict, or touches JSON or pickle
outside the codec."""

from __future__ import annotations

import ast
import dataclasses
import os
import threading
from pathlib import Path
from typing import get_args, get_type_hints

from ddptui.contract.options.config import DeviceOptions, RunConfig
from ddptui.contract.protocol.codec import decode, encode, event_of, order_of
from ddptui.contract.protocol.events import Beat, Rank, Stacks, Step
from ddptui.contract.protocol.orders import ORDERS, Order, Stop
from ddptui.contract.protocol.reference import reference
from ddptui.contract.states import RankState
from ddptui.rank.elastic.agreed import AgreedOrders
from ddptui.run.builtin.supervisor import Supervisor
from tests.helpers.runs import ROOT

DOCS = os.path.join(ROOT, "docs", "events.md")
PROTOCOL = os.path.join("ddptui", "contract", "protocol")
CODEC = os.path.join(PROTOCOL, "codec.py")


def _sources() -> list[Path]:
    root = Path(ROOT)
    return sorted([*root.glob("ddptui/**/*.py"), *root.glob("trainer/**/*.py")])


def test_docs_events_md_is_written_from_the_protocols_classes():
    with open(DOCS, encoding="utf-8") as f:
        assert f.read() == reference(), \
            "run: python -m ddptui.contract.protocol.reference > docs/events.md"


def test_the_codec_decodes_only_what_fits_and_reads_earlier_logs():
    step = Step(rank=0, epoch=0, step=3, global_step=3, loss=None, steps=3, samples_per_s=10.5,
                step_ms=12, data_wait=0.0)
    assert decode(encode(step)) == step
    line = step.fields()
    assert event_of({**line, "loss": "low"}) is None  # a value of the wrong type
    assert event_of({k: v for k, v in line.items() if k != "epoch"}) is None  # one missing
    assert event_of({**line, "kind": "stepp"}) is None
    assert event_of({**line, "lss": 1.0}) == step  # a field it does not know: left out
    assert event_of(Rank(rank=1, state="stalled").fields() | {"state": "sleepy"}) is None
    # A message of an earlier release that carried a rank's stacks is the kind that holds them.
    old = {"t": 1.0, "kind": "message", "rank": -1, "level": "warning", "text": "rank 1 is in x",
           "stacks_of": 1, "stacks": "File x.py"}
    assert event_of(old) == Stacks(t=1.0, rank=-1, level="warning", text="rank 1 is in x",
                                   stacks_of=1, stacks="File x.py")


def test_every_order_the_dashboard_and_the_run_send_goes_through_the_codec_whole(tmp_path):
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
    assert [c.NAME for c in sent] == ["pause", "resume", "checkpoint", "settings", "apply",
                                      "stop_rank", "restart_rank", "kill_rank", "stacks", "stop"]
    assert [order_of(dict(c.fields())) for c in sent] == sent
    assert order_of({"op": "settings", "settings": {}}) is None  # no request
    # What rank 0 offers every rank is served there (the rest are the parent's own): one set of
    # handlers, the built-in loop's and a script's.
    ranks = [c for c in sent if c.NAME in ("pause", "resume", "checkpoint", "settings", "apply")]
    orders = _Recorded()
    orders.carry_out(ranks[:1])
    assert orders.paused and orders.said == [("run", "paused")]
    orders.carry_out(ranks[1:] + [Stop()])
    assert not orders.paused and orders.said[1] == ("run", "resumed")
    assert orders.saved and orders.pending == {"workers": 2, "prefetch": False}
    assert orders.apply_now and orders.stop and orders.interrupted
    orders.carry_out([Order()])  # an order of a later version: ignored, as on every rank


class _Recorded(AgreedOrders):
    """The kit's handlers with hooks that only record."""

    rank = 0

    def __init__(self):
        self.said, self.saved, self.pending = [], False, {}
        super().__init__(reporter=self, mailbox=None)

    def emit(self, ev) -> None:
        self.said.append((ev.NAME, ev.status))

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


def test_the_world_orders_go_through_the_codec_whole():
    from ddptui.run.membership import Membership

    world = Membership([0, 1], lambda: "tcp://127.0.0.1:1")
    orders = [a.order for a in world.stop(1, 0.0) if hasattr(a, "order")]
    assert orders and [order_of(dict(o.fields())) for o in orders] == orders
    assert {cls.NAME for cls in ORDERS.kinds.values()} >= {"reform", "join", "recover", "host"}


def test_the_rank_states_the_protocol_allows_are_rank_state_s():
    state = get_type_hints(Rank)["state"]
    assert get_args(state) == tuple(s.value for s in RankState)


def test_a_ranks_heartbeat_fits_the_protocol():
    """Beats go to the supervisor's watch only (never the log, which the tests decode): what
    the heartbeat thread sends is checked here."""
    from ddptui.rank.telemetry.heartbeat import Heartbeat, Pulse

    beats, two = [], threading.Event()

    def emit(beat: Beat) -> None:
        beats.append(beat)
        if len(beats) >= 2:
            two.set()

    pulse = Pulse()
    pulse.phase, pulse.step = "compute", 3
    beat = Heartbeat(pulse, 0, emit, interval=0.01)
    beat.start()
    assert two.wait(30)
    beat.stop()
    beat.join()
    assert [decode(encode(b)) for b in beats] == beats
    assert beats[-1].phase == "compute" and beats[-1].global_step == 3


def _literal_messages(tree: ast.AST) -> list[int]:
    """Lines that write an order or an event as a dict ({"op": ...}, {"kind": ...}, a
    `case {"op": ...}` pattern) or call an `event(...)` maker."""
    found = []
    for node in ast.walk(tree):
        keys = node.keys if isinstance(node, (ast.Dict, ast.MatchMapping)) else []
        if any(isinstance(k, ast.Constant) and k.value in ("op", "kind") for k in keys):
            found.append(node.lineno)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id == "event":
            found.append(node.lineno)
    return found


def test_no_code_writes_an_order_or_an_event_as_a_dict_outside_the_protocol():
    root = Path(ROOT)
    found = [f"{path.relative_to(root)}:{line}" for path in _sources()
             if not str(path.relative_to(root)).startswith(PROTOCOL)
             for line in _literal_messages(ast.parse(path.read_text()))]
    assert found == []


def test_no_code_touches_json_or_pickle_outside_the_codec():
    """Whatever crosses a process or reaches a file is written and read in one place."""
    root = Path(ROOT)
    found = []
    for path in _sources():
        if str(path.relative_to(root)) == CODEC:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
            found += [f"{path.relative_to(root)}:{node.lineno} {n}" for n in names
                      if n.split(".")[0] in ("json", "pickle")]
    assert found == []


def test_every_event_and_order_class_is_frozen():
    from ddptui.contract.protocol.events import EVENTS

    classes = [*EVENTS.kinds.values(), *ORDERS.kinds.values()]
    assert all(dataclasses.is_dataclass(c) and c.__dataclass_params__.frozen for c in classes)
