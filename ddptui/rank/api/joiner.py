"""A standby of your script joining a world (r): it waits in ddptui.init() for ddptui's order,
comes to the new world's store (rank 0 opened it), and runs your script on up to run.elastic()
while the members go on training; they stop to form the world with it once it is prepared.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import urllib.parse

import torch.distributed as dist

from ddptui.contract.protocol import events
from ddptui.contract.protocol.orders import Join
from ddptui.rank.api.rankside import RankSide
from ddptui.rank.elastic import store

WATCH_S = 0.05
# Your script waiting this long inside torch.distributed before run.elastic() needs its world
# now: an init_process_group() that connects at once (gloo's, NCCL's with device_id) waits for
# the members, which would otherwise wait for run.elastic().
BLOCKED_S = 0.5
DISTRIBUTED = os.sep + os.path.join("torch", "distributed") + os.sep


class Joiner:
    """The join order a standby was given, and its one word to ddptui that it is prepared:
    said by run.elastic(), or by a watch of the main thread once your script waits inside
    torch.distributed before that."""

    def __init__(self, me: RankSide, order: Join, world_store: dist.TCPStore):
        self.me, self.order, self.store = me, order, world_store
        self._said = threading.Event()
        self._lock = threading.Lock()
        threading.Thread(target=self._watch, args=(threading.main_thread().ident,),
                         name="ddptui-joining", daemon=True).start()

    def prepared(self) -> None:
        """The members may form the world with this rank now (said once)."""
        with self._lock:
            if self._said.is_set():
                return
            self._said.set()
        self.me.reporter.emit(events.Rank(rank=self.me.reporter.rank, state="restarting", standby="prepared"))

    def _watch(self, main: int | None) -> None:
        since = None
        while not self._said.wait(WATCH_S):
            frame = sys._current_frames().get(main)
            if frame is None or not _inside_distributed(frame):
                since = None
            elif since is None:
                since = time.monotonic()
            elif time.monotonic() - since >= BLOCKED_S:
                self.prepared()


def _inside_distributed(frame) -> bool:
    while frame is not None:
        if DISTRIBUTED in frame.f_code.co_filename:
            return True
        frame = frame.f_back
    return False


def await_join(me: RankSide) -> Joiner:
    """A standby (r on a rank of a run.elastic() script) waits in ddptui.init(), before the
    script forms its process group, for ddptui's order to join; the script then forms the
    order's world from the environment set here. The run ended first: the script exits."""
    order = me.mailbox.wait_urgent(None)
    if not isinstance(order, Join):
        me.close()
        raise SystemExit(0)
    members = order.members
    me.rank, me.world_size = members.index(me.slot), len(members)
    url = urllib.parse.urlsplit(order.init)
    # Non-blocking NCCL: the communicator the script makes lazily can be aborted (world.py), and
    # its set-up ends when a member died in it (TORCH_NCCL_NONBLOCKING_TIMEOUT).
    os.environ.update(RANK=str(me.rank), WORLD_SIZE=str(me.world_size),
                      MASTER_ADDR=url.hostname or "127.0.0.1", MASTER_PORT=str(url.port),
                      TORCH_NCCL_USE_COMM_NONBLOCKING="1")
    came = store.come_early(order.init, me.world_size)
    me.reporter.emit(events.Rank(rank=me.reporter.rank,
                                 state="restarting", pid=os.getpid(), standby="preparing"))
    return Joiner(me, order, came)
