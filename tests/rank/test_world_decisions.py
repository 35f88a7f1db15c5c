"""The world-change protocol's guarantees on their own, without a process or a collective
(ddptui/rank/elastic/decisions.py): a member dying at each phase of a join, a joiner dying, two
changes at once. The end-to-end runs of the same races are tests/run/builtin/test_elastic.py's."""

from __future__ import annotations

from ddptui.rank.elastic.decisions import (
    ABORT,
    CUT_STORE,
    FAILED,
    LEFT,
    MEMBER,
    RECOVER,
    SEVER,
    SHUT_LISTENERS,
    Forming,
    WorldWatch,
    after_join,
    after_reform,
    state_sender,
)


def test_a_death_in_a_formed_world_aborts_its_collectives_at_once():
    watch = WorldWatch()
    assert watch.death(generation=3) == [SEVER, ABORT]
    assert watch.lost


def test_a_death_while_the_main_thread_changes_its_world_is_raised_when_the_change_is_done():
    """No abort from the mailbox thread: it would free the communicator under the main
    thread's own NCCL calls (a joiner's state being sent)."""
    watch = WorldWatch(changing=True)
    assert ABORT not in watch.death(generation=2)
    assert watch.change_ends() is True
    assert not WorldWatch(changing=True).change_ends()  # no death: the change stands


def test_a_member_dying_as_a_world_forms_wakes_those_waiting_at_its_store():
    """Before the meeting: a rank that does not own the store has its connections to it cut
    (it waits there for the dead one); the store's own rank is not cut before all have met."""
    joiner = WorldWatch(forming=Forming(store_port=29600))
    assert joiner.death(generation=2) == [SEVER, CUT_STORE]
    owner = WorldWatch(forming=Forming(store_port=29600, own_store=True))
    assert owner.death(generation=2) == [SEVER]
    met = WorldWatch(forming=Forming(store_port=29600, own_store=True, met=True))
    assert met.death(generation=2) == [SEVER, CUT_STORE]


def test_a_member_dying_in_ncclss_set_up_shuts_its_listening_sockets_and_aborts_nothing():
    watch = WorldWatch(forming=Forming(store_port=29600, own_store=True, met=True, nccl=True))
    assert watch.death(generation=2) == [SEVER, CUT_STORE, SHUT_LISTENERS]


def test_a_change_ordered_before_a_death_is_void():
    """Two changes at once: a join ordered at generation 4, a member's death recovered at 5;
    the join, offered after the recovery, would wait for the dead rank for ever."""
    watch = WorldWatch()
    watch.death(generation=5)
    assert not watch.stands(4)
    assert watch.stands(5) and watch.stands(6)


def test_the_leaving_rank_is_out_whatever_happens_to_the_others():
    assert after_reform(leaving=True, lost=True) == LEFT
    assert after_reform(leaving=True, lost=False) == LEFT
    assert after_reform(leaving=False, lost=False) == MEMBER
    assert after_reform(leaving=False, lost=True) == RECOVER


def test_a_joiner_that_settled_recovers_with_the_others_one_that_did_not_fails_its_join():
    """A member dying at each phase of a join, as the joiner sees it."""
    assert after_join(settled=False, lost=True) == FAILED  # before it held the state
    assert after_join(settled=True, lost=True) == RECOVER  # after: a member of the world
    assert after_join(settled=True, lost=False) == MEMBER


def test_a_joiners_state_comes_from_the_first_member_that_is_not_the_joiner():
    assert state_sender([0, 2, 1], joiner=1) == (0, 2)
    assert state_sender([3, 0], joiner=3) == (1, 0)  # the joiner first: the next member sends
