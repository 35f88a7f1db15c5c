"""The membership state machine on its own, without a process: every transition, and the races
that end-to-end tests cannot reach (deaths during a change, requests behind a change that never
confirms, a stop and a join asked together)."""

from __future__ import annotations

import itertools

from ddptui.contract.protocol.orders import ChangeSettings, Pause
from ddptui.run.membership import Fail, Joining, Kill, Membership, Say, Standby, Tell


def _world(*members: int, timeout: float = 60.0) -> Membership:
    ports = itertools.count(1000)
    return Membership(list(members), lambda: f"tcp://127.0.0.1:{next(ports)}", timeout)


def _tells(actions) -> dict[int, dict]:
    """slot -> the order it is told, as it goes on the wire."""
    return {a.slot: a.order.fields() for a in actions if isinstance(a, Tell)}


def test_a_stop_is_offered_by_the_current_rank_0_and_confirmed_by_the_new_world():
    m = _world(0, 1, 2)
    actions = m.stop(0, now=0)
    (leader, order), = _tells(actions).items()
    assert leader == 0 and order["op"] == "reform" and order["members"] == [1, 2]
    assert m.members == [1, 2] and m.confirmed == [0, 1, 2] and m.leaving == {0}
    assert m.world_confirmed(order["gen"], now=1) == [] and m.idle()
    assert m.left(0) == [Standby(0)] and m.leaving == set()


def test_the_last_rank_and_a_rank_out_of_the_world_cannot_be_stopped():
    m = _world(0)
    assert isinstance(m.stop(0, 0)[0], Say) and m.idle()
    assert m.stop(5, 0) == [Say("rank 5 is not running", "warning")]


def test_restart_of_a_stopped_rank_waits_for_its_standby_then_joins():
    m = _world(0, 1)
    order = _tells(m.stop(1, 0))[0]
    m.world_confirmed(order["gen"], 1)
    m.left(1)
    actions = m.restart(1, standby_alive=True, now=2)  # still warming: queued
    assert not _tells(actions) and m.wanted == {1}
    actions = m.standby_ready(1, now=3)
    tells = _tells(actions)
    assert tells[0]["members"] == [0, 1] and tells[0]["joiner"] == 1
    assert tells[1]["op"] == "join" and Joining(1) in actions


def test_requests_during_a_change_wait_their_turn():
    m = _world(0, 1, 2)
    first = _tells(m.stop(2, 0))[0]
    assert m.stop(1, 0.5) == [] and m.deferred == [("stop", 1)]
    actions = m.world_confirmed(first["gen"], 1)
    assert _tells(actions)[0]["members"] == [0]


def test_a_stop_and_a_restart_asked_together_both_happen_in_order():
    m = _world(0, 1)
    leave = _tells(m.stop(1, 0))[0]
    assert m.restart(1, standby_alive=False, now=0.1) == []  # behind the leave
    actions = m.world_confirmed(leave["gen"], 1)
    assert not _tells(actions) and m.wanted == {1}  # no standby yet: the leaver is still out
    assert m.left(1) == [Standby(1)]
    join = _tells(m.standby_ready(1, 2))[0]
    assert join["members"] == [0, 1]


def test_a_change_never_confirmed_kills_the_members_that_did_not_enter():
    m = _world(0, 1, 2, timeout=10)
    order = _tells(m.stop(2, 0))[0]
    m.entered(0)
    assert m.tick(5) == []
    assert m.tick(11) == [Kill(1, "did not enter the new world within 10 s")]
    assert m.tick(12) == []  # not again while its death is handled
    # Its death re-forms the world from the member still alive, and what waited goes on.
    m.stop(0, 12)  # deferred
    actions = m.died(1, alive={0}, recoverable=True, why="killed by ddptui", now=13)
    recover = _tells(actions)
    assert list(recover) == [0] and recover[0]["op"] == "recover"
    assert recover[0]["gen"] > order["gen"]


def test_a_joiner_dying_in_its_rendezvous_is_not_counted_as_a_survivor():
    m = _world(0, 1)
    m.stop(1, 0)
    m.world_confirmed(1, 1)
    m.left(1)
    m.restart(1, True, 2)
    join = _tells(m.standby_ready(1, 3))
    assert join[1]["op"] == "join"
    actions = m.died(1, alive={0}, recoverable=True, why="killed by SIGKILL", now=4)
    recover = _tells(actions)
    assert list(recover) == [0] and recover[0]["members"] == [0]
    assert Standby(1) in actions


def test_a_survivor_dying_during_a_join_drops_the_joiner_too():
    m = _world(0, 1, 2)
    m.stop(2, 0)
    m.world_confirmed(1, 1)
    m.left(2)
    m.restart(2, True, 2)
    m.standby_ready(2, 3)  # joining: members [0, 1, 2], confirmed [0, 1]
    actions = m.died(1, alive={0, 2}, recoverable=True, why="killed by SIGKILL", now=4)
    assert Kill(2, "the world broke while rank 2 was joining") in actions
    assert _tells(actions)[0]["members"] == [0]
    assert m.wanted == {2}  # it joins again once a new standby is warm


def test_a_member_killed_once_the_world_formed_with_a_joiner_keeps_the_joiner():
    """The world of 3 with the joiner in it formed (its `world` event), then rank 2 died before
    the joiner's own `running` report came in: the joiner is a member, and the world goes on
    with ranks 0 and 1, for a stopped joiner and for a crashed one alike."""
    for how_out in ("stopped", "crashed"):
        m = _world(0, 1, 2)
        if how_out == "stopped":
            m.world_confirmed(_tells(m.stop(1, 0))[0]["gen"], 1)
            m.left(1)
        else:
            m.world_confirmed(_tells(m.died(1, {0, 2}, True, "killed by SIGKILL", 0))[0]["gen"], 1)
        m.restart(1, True, 2)
        join = _tells(m.standby_ready(1, 3))[0]
        m.world_confirmed(join["gen"], 4)  # formed; rank 1's `running` report still on its way
        actions = m.died(2, alive={0, 1}, recoverable=True, why="killed by SIGKILL", now=5)
        recover = _tells(actions)
        assert sorted(recover) == [0, 1] and recover[0]["members"] == [0, 1], how_out
        assert 1 not in m.out and m.out[2][0] == "crashed"


def _script_joining(slot: int, *others: int) -> Membership:
    """A script's world of `others` that `slot` (stopped) was told to join: it prepares."""
    ports = itertools.count(1000)
    m = Membership(sorted((slot, *others)), lambda: f"tcp://127.0.0.1:{next(ports)}",
                   prepared_joins=True)
    (order,) = _tells(m.stop(slot, 0)).values()
    m.world_confirmed(order["gen"], 1)
    m.left(slot)
    m.restart(slot, True, 2)
    return m


def test_a_scripts_joiner_prepares_before_the_members_are_told_and_takes_the_last_rank():
    m = _script_joining(0, 1, 2)
    actions = m.standby_ready(0, 3)
    tells = _tells(actions)  # the joiner, and rank 0 opens the store: the members train on
    join, host = tells[0], tells[1]
    assert sorted(tells) == [0, 1] and host == {**join, "op": "host"}
    assert join["op"] == "join" and join["prepare"] and Joining(0) in actions
    assert join["members"] == [1, 2, 0]  # last: never the rank that opens a store itself
    assert m.tick(now=3 + 10 * m.timeout) == []  # its script takes what it takes
    assert m.prepared(2, now=50) == []  # only its joiner says so
    (leader, reform), = _tells(m.prepared(0, now=50)).items()
    assert leader == 1 and reform == {**join, "op": "reform"}
    assert [a.slot for a in m.tick(now=51 + m.timeout)] == [1, 2, 0]  # then it is timed
    assert m.world_confirmed(reform["gen"], 52) == [] and m.confirmed == [1, 2, 0]
    assert _tells(m.stop(1, 53))[1]["members"] == [0, 2]  # a later world: by slot again


def test_a_scripts_joiner_dying_while_it_prepares_costs_the_members_nothing():
    m = _script_joining(2, 0, 1)
    m.standby_ready(2, 3)
    assert m.restart(2, True, 4) == [] and m.deferred == [("restart", 2)]  # behind the join
    actions = m.died(2, alive={0, 1}, recoverable=True, why="exited with 1", now=5)
    assert not _tells(actions)  # no recover order: the members never stopped
    assert m.members == m.confirmed == [0, 1] and m.held is None
    assert m.out[2] == ("crashed", "exited with 1")
    assert any(isinstance(a, Say) and "before it joined" in a.text for a in actions)
    assert m.wanted == {2} and m.deferred == []  # the r asked meanwhile: once a standby is warm
    assert actions[-1] == Standby(2)
    again = _tells(m.standby_ready(2, 6))
    assert again[2]["op"] == "join" and again[2]["members"] == [0, 1, 2]


def test_a_member_dying_while_a_scripts_joiner_prepares_recovers_and_drops_the_joiner():
    m = _script_joining(2, 0, 1)
    m.standby_ready(2, 3)
    actions = m.died(1, alive={0, 2}, recoverable=True, why="killed by SIGKILL", now=4)
    assert Kill(2, "the world broke while rank 2 was joining") in actions
    assert _tells(actions) == {0: _tells(actions)[0]} and _tells(actions)[0]["members"] == [0]
    assert m.held is None and m.prepared(2, now=5) == []


def test_a_leaver_dying_before_its_leave_is_agreed_does_not_hang_the_others():
    m = _world(0, 1, 2)
    m.stop(2, 0)  # ordered, not agreed yet
    actions = m.died(2, alive={0, 1}, recoverable=True, why="killed by SIGKILL", now=1)
    recover = _tells(actions)
    assert sorted(recover) == [0, 1] and recover[0]["members"] == [0, 1]


def test_a_death_with_no_rollback_or_no_survivor_fails_the_run():
    m = _world(0, 1)
    assert m.died(1, {0}, recoverable=False, why="killed by SIGKILL", now=0) == \
        [Fail("rank 1 killed by SIGKILL")]
    m = _world(0)
    assert isinstance(m.died(0, set(), True, "exited with code 1", 0)[0], Fail)


def test_the_last_member_dying_before_a_recovery_is_confirmed_fails_not_recovers_a_standby():
    """Rank 0 killed (its slot's live process is now its standby), then rank 1 before it
    confirmed the recovery: nobody is left, whatever the last confirmed world was (seen on CPU:
    a recover order sent to rank 0's standby hung the run)."""
    m = _world(0, 1)
    actions = m.died(0, {1}, True, "killed by ddptui", 0)
    assert _tells(actions)[1]["members"] == [1] and Standby(0) in actions
    assert m.confirmed == [0, 1]  # rank 1 never confirms: it is the one that hangs
    assert m.died(1, {0}, True, "killed by ddptui", 1) == [Fail("rank 1 killed by ddptui")]


def test_a_standby_dying_is_only_reported():
    m = _world(0, 1)
    actions = m.died(3, {0, 1}, True, "killed by SIGKILL", 0)
    assert len(actions) == 1 and actions[0].level == "warning" and m.idle()


def test_a_stop_past_a_stalled_rank_recovers_the_others_with_stop():
    m = _world(0, 1, 2)
    actions = m.halt_without([1], alive={0, 2}, now=0)
    orders = _tells(actions)
    assert sorted(orders) == [0, 2] and orders[0]["stop"] is True
    assert m.halt_without([0, 1, 2], alive=set(), now=1) == []


def test_commands_go_to_the_leader_and_an_unanswered_request_follows_a_new_leader():
    m = _world(0, 1, 2)
    settings = ChangeSettings(settings={"workers": 2}, request="r1")
    assert m.to_leader(Pause()) == [Tell(0, Pause())]
    assert m.to_leader(settings) == [Tell(0, settings)]
    assert m.ask_again({"r1": {"workers": 2}}) == []  # its leader is still in the world
    order = _tells(m.stop(0, now=0))[0]
    m.world_confirmed(order["gen"], now=1)
    assert m.ask_again({"r1": {"workers": 2}}) == [Tell(1, settings)]
    assert m.ask_again({"r1": {"workers": 2}}) == []  # sent once to the new leader
    assert m.ask_again({}) == [] and m.asked == {}  # answered: forgotten
    assert _world().to_leader(Pause()) == []
