"""Commands from the supervisor, agreed by every rank at the same step through a gloo group.

Rank 0 offers what its mailbox holds in a small async broadcast about every 50 ms and the ranks
read it one interval later, so control costs no device sync and almost no step time.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator

import torch
import torch.distributed as dist

from ddptui.contract.protocol.codec import order_of, parse
from ddptui.contract.protocol.orders import Host, Join, Order, Recover, WorldOrder
from ddptui.rank.compat import default_store
from ddptui.rank.elastic.decisions import ABORT, CUT_STORE, SHUT_LISTENERS, Forming, WorldWatch
from ddptui.rank.elastic.snapshot import WorldLost
from ddptui.rank.elastic.sockets import Sockets, open_sockets, sever, shut_listeners
from ddptui.rank.elastic.store import open_ahead

# Orders that cannot wait for an agreed step: the world they would be agreed in is broken
# (recover), or the process is not in a world yet (join).
URGENT = (Recover, Join)
OFFER_S = 0.05  # commands are offered about this often (a key waits about two offers)
MAX_GAP = 256  # steps between offers, at most (a fast model on a fast GPU)
RECOVER_WAIT_S = 10.0  # after a collective failed: how long a rank waits for the recover order
# Commands are agreed by every rank of the world: where some have no dashboard link (a variable
# set on one node only), live control is off on every rank, and said so.
CONTROL_OFF = "not every rank reports to the dashboard: live control is off"
LINKED_WAIT_S = 10.0  # a script's linked ranks wait this long for one another at the first step


class OrderPipe:
    """The supervisor's command pipe, read like a dashboard link's inbox: the next order (one
    that does not decode is dropped)."""

    def __init__(self, conn):
        self.conn = conn

    def recv(self) -> Order:
        while True:
            order = order_of(parse(self.conn.recv_bytes()))
            if order is not None:
                return order


class Mailbox:
    """Reads this rank's command pipe on a thread: urgent orders are kept apart (and announced
    through `on_urgent` at once), everything else waits for the agreed step."""

    def __init__(self, inbox, on_urgent: Callable[[Order], None] = lambda order: None):
        """`inbox.recv()`: the next order (a dashboard link's), or an OrderPipe (the
        supervisor's)."""
        self.inbox = inbox
        self.on_urgent = on_urgent
        self.commands: queue.Queue = queue.Queue()
        self.urgent: queue.Queue = queue.Queue()
        self.has_urgent = False  # read every step: a plain attribute, no lock
        # The connections of the world this rank is in, cut as soon as a peer is known dead.
        self.world_sockets: Sockets = Sockets()
        # What a death makes this thread do, and whether a change stands (decisions.py).
        self.watch = WorldWatch()
        self._before: Sockets | None = None  # an NCCL world's set-up: the sockets before it
        self._lock = threading.Lock()  # between has_urgent and the world being formed
        self.abort: Callable[[], None] | None = None  # unblocks NCCL collectives (world.abort)
        self._abort_lock = threading.Lock()  # held by an abort, or by a world change
        threading.Thread(target=self._read, name="mailbox", daemon=True).start()

    def _read(self) -> None:
        while True:
            try:
                msg = self.inbox.recv()
            except (EOFError, OSError):  # the supervisor is gone; the parent watch ends us
                self.urgent.put(None)
                return
            if isinstance(msg, Host):
                self._open_ahead(msg)
            elif isinstance(msg, URGENT):
                # The flag first: whatever the abort makes the main thread's collective raise,
                # it is then taken for the broken world it is. Then on_urgent (the abort), then
                # the order: the main thread, taking it at a step boundary, would otherwise
                # re-form the world while this thread still aborts the old one (the abort's
                # reset of torch's group registry breaks the new world: "group name has
                # already been created").
                with self._lock:
                    self.has_urgent = True
                    if isinstance(msg, Recover):
                        self.watch.can_abort = self.abort is not None
                        steps = self.watch.death(msg.gen)
                    else:
                        steps = []
                    forming, before = self.watch.forming, self._before
                if steps:
                    sever(self.world_sockets)
                if CUT_STORE in steps:
                    # Every connection to the world's store: rank 0 may have opened it before
                    # the forming began (open_ahead), with its own connection.
                    sever(open_sockets(), peer_port=forming.store_port)
                if SHUT_LISTENERS in steps and before is not None:
                    # NCCL's set-up waiting to accept a member that died before it came fails
                    # now, not at TORCH_NCCL_NONBLOCKING_TIMEOUT (5 s).
                    shut_listeners(open_sockets() - before, forming.store_port)
                self.on_urgent(msg)
                # A world half made is not aborted: the main thread is registering it (an abort
                # from here then corrupted the heap); its cut connections fail the forming.
                if ABORT in steps:
                    self._abort_unless_changing()
                self.urgent.put(msg)
            else:
                self.commands.put(msg)

    @staticmethod
    def _open_ahead(msg: Host) -> None:
        """Rank 0's store for a script's joiner, open at once (its world forms later, when the
        members are told); one that cannot listen fails that world's forming instead."""
        try:
            open_ahead(msg.init, len(msg.members))
        except RuntimeError:
            pass

    def _abort_unless_changing(self) -> None:
        if self._abort_lock.acquire(blocking=False):
            try:
                self.abort()
            finally:
                self._abort_lock.release()

    @contextlib.contextmanager
    def changing(self) -> Iterator[None]:
        """While the main thread changes its world (closes, forms, shares state, settles), no
        abort comes from this thread: one that frees the communicator under the main thread's
        own NCCL calls (a joiner's state being sent) corrupts the heap. The change waits on no
        collective that only an abort would end (a set-up ends by itself, objects go over
        gloo), and a death meanwhile is raised when it is done: the recovery then aborts from
        the main thread."""
        with self._abort_lock:  # an abort under way is finished first
            self.watch.changing = True
            try:
                yield
            finally:
                lost = self.watch.change_ends()
        if lost:
            raise WorldLost("a peer died as the world changed")

    @contextlib.contextmanager
    def forming(self, store_port: int | None, own_store: bool = False,
                nccl: bool = False) -> Iterator[None]:
        """While this rank forms an ordered world: a recover order (a member died before the
        world was made) cuts its connections to the world's store at `store_port`, so that a
        rank waiting there for the dead one (its address, NCCL's id) is woken now, not at a
        timeout. The store's own rank (`own_store`) waits polling for the others to come to
        it (meet()): its connections are cut only once they have (met()), as a request of its
        own cut then corrupted its heap (a joiner killed before it came). An `nccl` world's
        set-up has its listening sockets shut down by a recover order."""
        before = open_sockets() if nccl else None
        with self._lock:
            self.watch.forming = Forming(store_port, own_store, nccl=nccl)
            self._before = before
        try:
            yield
        finally:
            with self._lock:
                self.watch.forming, self._before = None, None

    def met(self) -> None:
        """Every member of the world being formed has come to its store."""
        with self._lock:
            if self.watch.forming is not None:
                self.watch.forming.met = True

    def void(self, order: WorldOrder) -> bool:
        """A world change that a rank's death overtook: the supervisor dropped it (its joiner is
        killed) and ordered a recovery after it, so carrying it out would wait for ever."""
        return not self.watch.stands(order.gen)

    def drain(self) -> list[Order]:
        cmds = []
        while True:
            try:
                cmds.append(self.commands.get_nowait())
            except queue.Empty:
                return cmds

    def requeue(self, cmds: list[Order]) -> None:
        """Put commands back in front: offered to a world that then changed, they are offered
        again to the new one (a joining rank must see them too)."""
        rest = self.drain()
        for cmd in cmds + rest:
            self.commands.put(cmd)

    def recover_order(self, error: BaseException,
                      timeout: float = RECOVER_WAIT_S) -> Recover | None:
        """After a step failed: the supervisor's recover order if a peer died (it comes within
        `timeout`), None if the error is this rank's own. Collective failures (DistError,
        WorldLost) are RuntimeErrors, an OOM is this rank's own; once a recover order is in,
        any error may come of the aborted world."""
        if isinstance(error, torch.OutOfMemoryError) or not (
                isinstance(error, RuntimeError) or self.has_urgent):
            return None
        order = self.wait_urgent(timeout)
        return order if isinstance(order, Recover) else None

    def wait_urgent(self, timeout: float | None) -> Order | None:
        """The next urgent order (None on timeout or when the supervisor has gone)."""
        try:
            order = self.urgent.get(timeout=timeout)
        except queue.Empty:
            return None
        with self._lock:
            self.has_urgent = not self.urgent.empty()
            if isinstance(order, Recover):  # the death is taken: a later one is news again
                self.watch.lost = self.has_urgent
        return order


def all_linked(linked: bool, group) -> bool:
    """The built-in loop's ranks, every one of them: whether each has a dashboard link."""
    flag = torch.tensor([int(linked)])
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=group)
    return bool(flag.item())


def every_rank_linked(world_size: int, give_up: Callable[[], bool] = lambda: False,
                      wait: float = LINKED_WAIT_S) -> bool | None:
    """A script's linked ranks, at their first step: each counts itself at the world's store and
    waits for the others. A rank without a link runs none of ddptui's code (its run's calls do
    nothing), so no collective may wait for it: the linked ranks of a world that has such a rank
    never reach the count, and give up after `wait` (DDP keeps their first steps together).
    None, undecided, as soon as `give_up` says a peer died (a new world is formed instead)."""
    store = default_store()
    key = f"ddptui/linked/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    store.add(key, 1)
    deadline = time.monotonic() + wait
    while store.add(key, 0) < world_size:
        if give_up():
            return None
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


class Control:
    """Rank 0 drains the mailbox; every rank gets the same commands back at the same step.

    The offer cadence follows time, not a count of steps: each offer also carries the number of
    steps to the next one, chosen by rank 0 so that offers come about every OFFER_S seconds.
    When steps are slower than that, each offer is read in the step it is made (a blocking gloo
    broadcast of two integers, no device sync), so a key waits at most about one step."""

    def __init__(self, mailbox: Mailbox | None, rank: int, group, offer_s: float = OFFER_S):
        self.mailbox = mailbox
        self.rank = rank
        self.group = group
        self.offer_s = offer_s
        self.active = mailbox is not None
        self._msg = torch.zeros(2, dtype=torch.int64)  # [commands offered, steps to the next]
        self._gap = 1  # agreed steps between offers (every rank has the same)
        self._countdown = self._ran = 1  # steps to the next offer; steps since the last one
        self._last_offer = time.perf_counter()
        self._work = None
        self._offered: list[Order] = []

    def poll(self) -> list[Order]:
        """Call after every step; returns the commands every rank applies now."""
        if not self.active:
            return []
        self._countdown -= 1
        if self._countdown > 0:
            return []
        agreed = self._complete()
        if self.rank == 0:
            now = time.perf_counter()
            step_s = (now - self._last_offer) / self._ran  # the steps since the last offer
            self._last_offer = now
            self._offered = self.mailbox.drain()
            self._msg[0] = len(self._offered)
            self._msg[1] = max(1, min(MAX_GAP, round(self.offer_s / max(step_s, 1e-6))))
        self._work = dist.broadcast(self._msg, src=0, group=self.group, async_op=True)
        self._countdown = self._ran = self._gap
        if self._gap == 1:  # slow steps: waiting one more step would double a key's delay
            agreed += self._complete()
        return agreed

    def tick_paused(self, period: float = 0.3) -> list[Order]:
        """While paused: a blocking exchange every `period` s (so no collective times out)."""
        agreed = self._complete()
        if self.rank == 0:
            time.sleep(period)
        box = [self.mailbox.drain() if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return agreed + box[0]

    def finish(self) -> list[Order]:
        """Complete the broadcast in flight (every rank at the same point); its commands are
        returned so that none offered is lost when the world changes."""
        return self._complete()

    def _complete(self) -> list[Order]:
        if self._work is None:
            return []
        self._work.wait()
        self._work = None
        self._gap = int(self._msg[1])
        if int(self._msg[0]) == 0:
            return []
        box = [self._offered if self.rank == 0 else None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        return box[0]
