"""The one way a rank's world changes, for the built-in loop and a run.elastic() script alike: an
agreed leave or join re-forms the intact world, a peer's death re-forms it from the survivors and
rolls back to the newest point they all hold. Each kind of rank brings its own state (Member).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch
import torch.distributed as dist

from ddptui.contract.protocol.codec import pack, unpack
from ddptui.contract.protocol.orders import Order, WorldOrder
from ddptui.rank.elastic.control import Mailbox
from ddptui.rank.elastic.decisions import FAILED, LEFT, MEMBER, after_join, after_reform, state_sender
from ddptui.rank.elastic.snapshot import WorldLost, agree
from ddptui.rank.elastic.world import dismantle, form_ordered


class Member(Protocol):
    """A rank as a world change sees it: its place, and the hooks for what it trains."""

    mailbox: Mailbox
    slot: int  # its name for the whole run: order.members lists slots
    rank: int
    world_size: int
    device: torch.device
    eager: bool  # its worlds' NCCL communicators are made at init (world.form)

    def mark(self, phase: str) -> None:
        """A phase of the change ended (the built-in loop reports what each one cost)."""

    def warn(self, text: str) -> None: ...

    def state_for_joiner(self) -> tuple[dict, list[torch.Tensor]]:
        """What a joiner needs: a picklable host part and the tensors, in a fixed order."""

    def tensors_to_receive(self, specs: list[tuple]) -> list[torch.Tensor]:
        """Tensors the state is received into: (shape, dtype, device type) each."""

    def load_from_member(self, host: dict, tensors: list[torch.Tensor]) -> None: ...

    def rollback_summary(self) -> Any:
        """What this rank's rollback points are (snapshot.agree reads every member's)."""

    def roll_back(self, target: int) -> int:
        """Go back to the point at global step `target`; returns the steps to be redone."""

    def settle(self, group, order: WorldOrder, leftover: list[Order]) -> None:
        """What follows a new world: DDP, the group orders are agreed in, shards, a point."""


# Each change holds off the mailbox's abort until it is done (Mailbox.changing) and raises
# WorldLost then if a member died meanwhile; its recover order follows.
def reform(m: Member, order: WorldOrder, leftover: list[Order]) -> bool:
    """An agreed leave or join: the members re-form at the same step. False for the one leaving,
    which is out of the world then."""
    leaving = m.slot not in order.members
    try:
        with m.mailbox.changing():
            dismantle(m.warn, collect=False)
            m.mark("close")
            if leaving:
                return False
            group = enter(m, order)
            if order.joiner is not None:
                share_state(m, order, group)
            m.settle(group, order, leftover)
    except WorldLost:
        if after_reform(leaving, lost=True) == LEFT:  # the world it left is no concern of it
            return False
        raise
    return after_reform(leaving, lost=False) == MEMBER


def join(m: Member, order: WorldOrder, formed: Callable[[], Any] | None = None) -> bool:
    """A standby takes its place in the order's world and a live member's state. `formed`: the
    gloo group of a world the rank's script formed itself (a script's joiner). True when a
    member died once this rank held the state and had settled: it is a member of the world
    that broke (the supervisor counts it so) and recovers with the others, from the recover
    order waiting in its mailbox; a death before that fails the join (WorldLost)."""
    settled = False
    try:
        with m.mailbox.changing():
            group = formed() if formed is not None else enter(m, order)
            try:
                share_state(m, order, group)
            except RuntimeError as e:  # the connections cut under its transfer
                if not m.mailbox.has_urgent:
                    raise
                raise WorldLost("a member died while this rank took its state") from e
            m.settle(group, order, [])
            settled = True
    except WorldLost:
        if after_join(settled, lost=True) == FAILED:
            raise
        return True  # RECOVER
    return False


def recover(m: Member, order: WorldOrder) -> int:
    """After a peer died: re-form from the survivors and go back to the newest rollback point
    they all hold; returns the number of steps that will be redone."""
    with m.mailbox.changing():
        dismantle(m.warn, collect=True)
        m.mark("close")
        group = enter(m, order)
        summaries: list = [None] * m.world_size
        dist.all_gather_object(summaries, m.rollback_summary(), group=group)
        target = agree(summaries)
        if target is None:
            raise RuntimeError("a rank died and the survivors share no rollback point")
        redone = m.roll_back(target)
        m.mark("rollback")
        m.settle(group, order, [])
    return redone


def enter(m: Member, order: WorldOrder):
    """Take this rank's place in the order's world and form it; returns the gloo group orders
    are agreed in."""
    members = order.members
    m.rank, m.world_size = members.index(m.slot), len(members)
    group = form_ordered(m.mailbox, m.rank, m.world_size, m.device, order.init, m.eager)
    m.mark("form")
    return group


def share_state(m: Member, order: WorldOrder, group) -> None:
    """The first member that is not the joiner sends the joiner its state, point to point: the
    host part and CPU tensors pickled over the gloo `group` (a dead peer fails it at once), the
    device tensors in one batch over the world's communicator (a plain send/recv pair would make
    a communicator of their own, one more place for a peer's death to leave a rank in NCCL's
    set-up)."""
    src, dst = state_sender(order.members, order.joiner)
    if m.rank == src:
        host, tensors = m.state_for_joiner()
        meta = {"host": host, "specs": [(t.shape, t.dtype, t.device.type) for t in tensors],
                "cpu": {i: t for i, t in enumerate(tensors) if not t.is_cuda}}
        _send_object(meta, dst, group)
        _exchange([dist.P2POp(dist.isend, t, dst) for t in tensors if t.is_cuda])
    elif m.rank == dst:
        meta = _recv_object(src, group)
        tensors = m.tensors_to_receive(meta["specs"])
        for i, t in meta["cpu"].items():
            tensors[i].copy_(t)
        _exchange([dist.P2POp(dist.irecv, t, src) for t in tensors if t.is_cuda])
        m.load_from_member(meta["host"], tensors)
    m.mark("state")


# gloo's point-to-point calls keep the timeout their group was made with (world.CONNECT, 1 s)
# whatever it is set to later: a joiner's state (a model's worth on CPUs) took longer than that
# on a loaded machine. Waited for with the default timeout instead, as a collective would be.
def _send_object(obj: Any, dst: int, group) -> None:
    data = torch.frombuffer(bytearray(pack(obj)), dtype=torch.uint8)
    for t in (torch.tensor([data.numel()]), data):
        dist.isend(t, dst, group=group).wait(timeout=dist.default_pg_timeout)


def _recv_object(src: int, group) -> Any:
    size = torch.zeros(1, dtype=torch.int64)
    dist.irecv(size, src, group=group).wait(timeout=dist.default_pg_timeout)
    data = torch.empty(int(size), dtype=torch.uint8)
    dist.irecv(data, src, group=group).wait(timeout=dist.default_pg_timeout)
    return unpack(data.numpy().tobytes())


def _exchange(ops: list) -> None:
    """Point-to-point operations as one batch, waited for."""
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()
