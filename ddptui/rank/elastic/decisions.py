"""The world-change protocol's decisions, as a pure state machine: what a rank's mailbox thread
does when a death is announced (a recover order) at each moment of a change, whether an order a
death overtook still stands, and how a leave, a join or a recovery ends for this rank. The
threads, sockets and collectives that carry them out are control.py's and change.py's.

What it guarantees (docs/architecture.md, "The world changes at an agreed step"):
- a world change ordered before a death is void: a death's recovery comes after it, and
  carrying the change out would wait for the dead rank for ever;
- while a world forms, a death wakes every rank waiting at its store: their connections to it
  are cut once every member met there, or at once on a rank that does not own the store (the
  store's own rank is never cut before: a request of its own failing corrupted its heap); an
  NCCL world's set-up has its listening sockets shut (a dead member never connects);
- no abort comes from the mailbox thread while the main thread changes its world (it would
  free the communicator under the main thread's own NCCL calls) or while a world forms; a
  death meanwhile is raised when the change is done, and the recovery aborts from the main
  thread;
- a leaving rank is out of the world at the agreed step, whatever happens to the others;
- a joiner that settled in the new world before a death is a member of the world that broke
  and recovers with the others; a death before that fails its join;
- a joiner's state comes from the first member of the new world that is not the joiner.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# What the mailbox thread does at once on a recover order, in this order.
SEVER = "sever the world's connections"
CUT_STORE = "cut the connections to the forming world's store"
SHUT_LISTENERS = "shut the listening sockets of NCCL's set-up"
ABORT = "abort the world's collectives"

LEFT, MEMBER, RECOVER, FAILED = "left", "member", "recover", "failed"


@dataclass
class Forming:
    """A world being formed: its store's port, whether this rank owns the store, whether every
    member came there, whether NCCL's set-up may listen for a member."""

    store_port: int | None
    own_store: bool = False
    met: bool = False
    nccl: bool = False


@dataclass
class WorldWatch:
    """One rank's view of its world's changes: the newest death it was told of (its recover
    order's generation), the world it forms, whether its main thread changes its world, and
    whether a death came since it last looked (`lost`)."""

    generation: int = 0
    forming: Forming | None = None
    changing: bool = False
    lost: bool = False
    can_abort: bool = True  # the world has collectives an abort ends (an NCCL world)
    done: list[str] = field(default_factory=list)  # what the last death made it do

    def death(self, generation: int) -> list[str]:
        """A recover order (a member died): what the mailbox thread does now."""
        self.lost = True
        self.generation = max(self.generation, generation)
        steps = [SEVER]
        f = self.forming
        if f is not None and f.store_port is not None and (f.met or not f.own_store):
            steps.append(CUT_STORE)
        if f is not None and f.nccl:
            steps.append(SHUT_LISTENERS)
        if f is None and not self.changing and self.can_abort:
            steps.append(ABORT)
        self.done = steps
        return steps

    def stands(self, generation: int) -> bool:
        """Whether a change ordered at `generation` still stands (no death overtook it)."""
        return generation >= self.generation

    def change_ends(self) -> bool:
        """The main thread's change is done: True when a death came meanwhile (it is raised
        then, and the recovery aborts from the main thread)."""
        self.changing = False
        return self.lost


def after_reform(leaving: bool, lost: bool) -> str:
    """How an agreed leave or join ends for a rank of the world: the one leaving is out (a death
    as it left is no concern of it); a member goes on, or recovers after a death."""
    if leaving:
        return LEFT
    return RECOVER if lost else MEMBER


def after_join(settled: bool, lost: bool) -> str:
    """How a join ends for the joiner: a death after it settled makes it a member of the world
    that broke (it recovers with the others); one before fails its join."""
    if not lost:
        return MEMBER
    return RECOVER if settled else FAILED


def state_sender(members: list[int], joiner: int) -> tuple[int, int]:
    """(the world rank that sends the joiner its state, the joiner's world rank): the first
    member that is not the joiner."""
    src = members.index(next(s for s in members if s != joiner))
    return src, members.index(joiner)
