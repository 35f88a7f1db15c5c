"""The report channel's two ends under bad timing: a peer that connects and says nothing, a
dashboard that accepts and never answers. Neither holds the other for ever; the rank gets in."""

from __future__ import annotations

import socket
import time

import pytest

from ddptui.contract.listener import ReportListener
from ddptui.contract.protocol.events import Notice, Step
from ddptui.rank.telemetry.remote import RemoteLink
from tests.helpers.runlogs import logged
from tests.helpers.runs import REPORT_KEY

KEY = REPORT_KEY.encode()


def _until(check, seconds: float = 60) -> bool:
    deadline = time.monotonic() + seconds
    while not check() and time.monotonic() < deadline:
        time.sleep(0.05)
    return check()


@pytest.mark.timeout(120)
def test_a_peer_that_connects_and_says_nothing_is_dropped_and_ranks_still_get_in():
    """A connection that never answers the challenge (a port scanner, a rank frozen mid-
    handshake) is refused after the handshake's time limit; a rank connecting meanwhile is in."""
    from ddptui.contract.channel import connect, send

    got, notes = [], []
    listener = ReportListener(("127.0.0.1", 0), KEY, got.append,
                              lambda level, text: notes.append(text))
    listener.start()
    silent = socket.create_connection(listener.address)
    conn = connect(listener.address, KEY)
    send(conn, logged("rank", 3, state="running", pid=1003))
    assert _until(lambda: listener.connected() == {3})
    assert _until(lambda: any("no handshake" in n for n in notes))
    silent.close()
    conn.close()
    listener.close()


@pytest.mark.timeout(120)
def test_a_rank_whose_dashboard_accepted_and_went_quiet_gets_in_once_one_answers():
    """The listener accepted the rank's connection and never answered (a listen queue that
    dropped it, a dashboard frozen): the rank's link gives up on that handshake and keeps
    trying; a dashboard on the same port then gets its events."""
    quiet = socket.create_server(("127.0.0.1", 0))
    address = quiet.getsockname()
    held = []
    warnings: list[str] = []
    link = RemoteLink(address, KEY, "node-a", warnings.append)
    link.put(Step(rank=0, epoch=0, step=1, global_step=1, loss=None))
    held.append(quiet.accept()[0])  # accepted, and never a word
    quiet.close()
    got = []
    listener = None
    deadline = time.monotonic() + 60
    while listener is None and time.monotonic() < deadline:
        try:  # the port is free once the quiet server's connection is closed
            for s in held:
                s.close()
            listener = ReportListener(address, KEY, got.append, lambda level, text: None)
        except OSError:
            time.sleep(0.2)
    assert listener is not None
    listener.start()
    assert _until(lambda: any(isinstance(e, Step) and e.node == "node-a" for e in got))
    link.close()
    listener.close()


@pytest.mark.timeout(120)
def test_a_flood_of_refused_connections_writes_a_few_lines_not_one_a_try():
    """50 peers that connect and go without a handshake (a port scanner): the first ten are
    said, the rest counted; a rank connecting after them is in."""
    from ddptui.contract.channel import connect, send

    notes: list[str] = []
    listener = ReportListener(("127.0.0.1", 0), KEY, lambda ev: None,
                              lambda level, text: notes.append(text))
    listener.start()
    for _ in range(50):
        socket.create_connection(listener.address).close()
    assert _until(lambda: len(notes) >= 10)
    conn = connect(listener.address, KEY)
    send(conn, logged("rank", 2, state="running", pid=1002))
    assert _until(lambda: listener.connected() == {2})
    time.sleep(1.0)  # the last refusals said, if they were to be
    assert len(notes) == 10 and all("no handshake" in n for n in notes)
    assert "10 refused so far" in notes[-1]
    conn.close()
    listener.close()


@pytest.mark.timeout(120)
def test_a_rank_whose_link_reconnected_before_its_old_connection_closed_gets_its_orders():
    """A rank's link opens a new connection and speaks on it before the listener has read the
    old one's close: the old one closing leaves the rank its new one, and an order reaches it
    (it was "not connected" until its next event, and a rank blocked in a collective has none)."""
    from ddptui.contract.channel import connect, receive, send
    from ddptui.contract.protocol.orders import Pause

    closed: list[bool] = []
    got: list = []
    listener = ReportListener(("127.0.0.1", 0), KEY, got.append, lambda level, text: None,
                              closed=lambda: closed.append(True))
    listener.start()
    old = connect(listener.address, KEY)
    send(old, logged("rank", 0, state="running", pid=1000))
    assert _until(lambda: listener.connected() == {0})
    new = connect(listener.address, KEY)
    send(new, Step(rank=0, epoch=0, step=5, global_step=5, loss=None))
    assert _until(lambda: any(isinstance(e, Step) for e in got))  # the route stays with old
    old.close()
    assert _until(lambda: closed)
    assert listener.connected() == {0}
    assert listener.send(0, Pause())
    assert isinstance(receive(new), Pause)
    new.close()
    listener.close()


@pytest.mark.timeout(120)
def test_a_world_order_for_a_rank_between_connections_waits_for_it_a_while():
    """tell(): an order for a rank with no connection is held and sent when the rank speaks
    again; one whose rank does not come back in time is said as not sent, and never sent."""
    from ddptui.contract.channel import connect, receive, send
    from ddptui.contract.protocol.orders import Pause, Resume

    notes: list[str] = []
    listener = ReportListener(("127.0.0.1", 0), KEY, lambda ev: None,
                              lambda level, text: notes.append(text), hold_s=1.0)
    listener.start()
    listener.tell(0, Pause())
    conn = connect(listener.address, KEY)
    send(conn, Step(rank=0, epoch=0, step=5, global_step=5, loss=None))
    assert isinstance(receive(conn), Pause)
    listener.tell(3, Resume())
    assert _until(lambda: any("rank 3 is not connected" in n for n in notes))
    late = connect(listener.address, KEY)
    send(late, Step(rank=3, epoch=0, step=5, global_step=5, loss=None))
    assert _until(lambda: 3 in listener.connected())
    assert listener.send(3, Pause())
    assert isinstance(receive(late), Pause)  # the first it got: not the Resume given up on
    assert notes == ["rank 3 is not connected: the command was not sent (held 1 s for it)"]
    conn.close()
    late.close()
    listener.close()


@pytest.mark.timeout(120)
def test_events_a_node_link_dropped_while_away_are_said_for_each_of_its_ranks():
    """A node's relay holds its ranks' events in one bounded buffer while attach is away: once
    attach listens, each rank that lost events is told how many of its own, none another's."""
    spare = socket.create_server(("127.0.0.1", 0))
    address = spare.getsockname()
    spare.close()  # nobody listens there yet
    warnings: list[str] = []
    link = RemoteLink(address, KEY, "node-a", warnings.append, limit=4, every=0.0)
    for i in range(10):  # ranks 0, 1, 0, 1...: the oldest six go, three of each
        link.put(Step(rank=i % 2, epoch=0, step=i, global_step=i, loss=None))
    link.put(Step(rank=1, epoch=0, step=10, global_step=10, loss=None))  # one more of rank 1
    assert _until(lambda: any("no dashboard" in w for w in warnings))
    got: list = []
    listener = ReportListener(address, KEY, got.append, lambda level, text: None)
    listener.start()
    assert _until(lambda: any(isinstance(e, Step) and e.step == 10 for e in got))
    said = sorted((e.rank, e.text) for e in got if isinstance(e, Notice))
    assert said == [(0, "4 events dropped while the dashboard was away"),
                    (1, "3 events dropped while the dashboard was away")]
    assert [e.step for e in got if isinstance(e, Step)] == [7, 8, 9, 10]
    link.close()
    listener.close()


@pytest.mark.timeout(120)
def test_orders_held_for_a_rank_come_in_the_order_told_and_a_new_attempt_voids_them():
    """tell()'s orders reach the rank oldest first once it speaks; drop_held() (a new attempt)
    voids those told before it, unsaid."""
    from ddptui.contract.channel import connect, receive, send
    from ddptui.contract.protocol.orders import Pause, Resume, Stop

    notes: list[str] = []
    listener = ReportListener(("127.0.0.1", 0), KEY, lambda ev: None,
                              lambda level, text: notes.append(text), hold_s=1.0)
    listener.start()
    listener.tell(0, Stop())  # for the last attempt's rank 0
    listener.drop_held()  # a new attempt: its world begins
    listener.tell(0, Pause())
    listener.tell(0, Resume())
    conn = connect(listener.address, KEY)
    send(conn, Step(rank=0, epoch=0, step=1, global_step=1, loss=None))
    assert [type(receive(conn)) for _ in range(2)] == [Pause, Resume]
    listener.tell(0, Stop())  # connected: at once
    assert isinstance(receive(conn), Stop)
    time.sleep(1.5)  # past hold_s: nothing delivered is said as not sent, nor the voided one
    assert notes == []
    conn.close()
    listener.close()
