"""Rank 0's TCP store, where the members of a world ddptui orders meet before forming it.

Every wait here gives up as soon as a member is known dead, instead of at torch's timeouts.
"""

from __future__ import annotations

import contextlib
import socket
import time
import urllib.parse
from collections.abc import Callable, Iterator
from datetime import timedelta

import torch.distributed as dist

from ddptui.rank.elastic.snapshot import WorldLost

ARRIVED = "ddptui/arrived"  # a world's members that came to its store
STORE_CONNECT = timedelta(seconds=2)  # a store client's attempt to reach rank 0's store

# The stores of worlds that failed to form, never freed: freeing a rank 0's store then corrupts
# the heap (torch 2.11). A port and a thread each.
ABANDONED: list = []
# The stores rank 0 opened ahead of a script's join (open_ahead), by address, until its world
# forms; and a joiner's connection to the store it came to before its script ran on.
OPENED: dict[str, dist.TCPStore] = {}
CAME: list = []


def meet(init_method: str, rank: int, world_size: int,
         give_up: Callable[[], bool] = lambda: False) -> dist.TCPStore:
    """The world's store, once every member has come to it: at a tcp:// address ddptui gave, or
    at env:// (torchrun's or srun's rank 0, or torchrun's agent). At tcp:// rank 0's store does
    not wait for the others: a member that died before it came is noticed here (`give_up`), not
    inside torch's constructors, whose failure halfway corrupts the heap or hangs their
    destruction (NCCL). At env:// a rank that comes late (its imports on a loaded node) is
    waited for as torch waits, not for gloo's connect."""
    url = urllib.parse.urlsplit(init_method)
    if url.scheme == "env":
        store, _, _ = next(dist.rendezvous(init_method, rank, world_size,
                                           timeout=dist.default_pg_timeout))
    elif url.scheme != "tcp" or url.hostname is None or url.port is None:
        raise ValueError(f"worlds form at tcp://HOST:PORT or env://, not {init_method}")
    elif rank != 0:
        store = store_client(init_method, world_size, give_up)
    elif (store := OPENED.pop(init_method, None)) is None:
        store = _listen(init_method, world_size)
    with kept_on_failure(store):
        arrive(store, ARRIVED, world_size, give_up)
    return store


def _listen(init_method: str, world_size: int) -> dist.TCPStore:
    url = urllib.parse.urlsplit(init_method)
    return dist.TCPStore(url.hostname, url.port, world_size, is_master=True,
                         timeout=dist.default_pg_timeout, wait_for_workers=False)


def open_ahead(init_method: str, world_size: int) -> None:
    """Rank 0, told that a script's rank will join: the coming world's store listens now, so
    that the joiner's script connects to it (env://) while the members train on; they meet
    there once it is prepared. Never freed if that join is called off."""
    OPENED[init_method] = _listen(init_method, world_size)


def come_early(init_method: str, world_size: int) -> dist.TCPStore:
    """A script's joiner counts itself in at its world's store before its script runs on: an
    init_process_group() that connects at once waits there for the members, which must not wait
    for it in turn. Returns its connection to the store, kept for the process's life."""
    store = store_client(init_method, world_size)
    CAME.append(store)
    store.add(ARRIVED, 1)
    return store


def arrive(store: dist.TCPStore, key: str, world_size: int,
           give_up: Callable[[], bool] = lambda: False) -> None:
    """Count this member in at `key` and wait for all `world_size`, or raise WorldLost as soon
    as `give_up` says a member died."""
    store.add(key, 1)
    while store.add(key, 0) < world_size:
        if give_up():
            raise WorldLost("a peer died before the world formed")
        time.sleep(0.002)


@contextlib.contextmanager
def kept_on_failure(store: dist.TCPStore | None) -> Iterator[None]:
    """A world's store that failed to form is never freed (ABANDONED)."""
    try:
        yield
    except BaseException:
        if store is not None:
            ABANDONED.append(store)
        raise


def store_client(init_method: str, world_size: int,
                 give_up: Callable[[], bool] = lambda: False) -> dist.TCPStore:
    """A client of rank 0's store, once it listens, tried for STORE_CONNECT at a time: a client
    tries for torch's default 30 minutes, out of `give_up`'s reach, where rank 0 died after its
    port listened."""
    url = urllib.parse.urlsplit(init_method)
    while True:
        await_store(init_method, give_up)
        try:
            store = dist.TCPStore(url.hostname, url.port, world_size, is_master=False,
                                  timeout=STORE_CONNECT, wait_for_workers=False)
        except RuntimeError:  # DistNetworkError: refused, or timed out
            if give_up():
                raise WorldLost("a peer died before the world formed") from None
            continue
        store.set_timeout(dist.default_pg_timeout)
        return store


def await_store(init_method: str, give_up: Callable[[], bool] = lambda: False,
                patience: float = 60.0) -> None:
    """Wait until rank 0's store listens at a tcp:// address. TCPStore's client, refused,
    tries again only after a back-off, long against a join that waits for rank 0 to close its
    old group (docs/benchmarks-log.md, the CPU machine). Anything else is left to
    init_process_group to report."""
    url = urllib.parse.urlsplit(init_method)
    if url.scheme != "tcp" or url.hostname is None or url.port is None:
        return
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        if give_up():
            raise WorldLost("a peer died before the world formed")
        try:
            socket.create_connection((url.hostname, url.port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.002)


