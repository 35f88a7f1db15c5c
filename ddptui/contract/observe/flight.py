"""torch's NCCL flight recorder in a script's ranks: turned on through the environment, dumped on
`t` through the named pipe each rank's NCCL watchdog polls, and read back as one line per rank
saying which collective it is in. Works while the rank's Python is hung: torch's threads answer.
"""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterable

from ddptui.contract.observe.stacks import Awaited, settled_answers
from ddptui.contract.protocol.codec import plain_data

TRACE_ENTRIES = "2000"  # the ring buffer: collectives kept per rank
DUMP_WAIT_S = 30.0  # the watchdog looks at its pipe about once a second; the dump symbolizes
# the C++ stacks of every entry first, which takes seconds


def trace_prefix(stem: str) -> str:
    """Where a run's dumps go, beside its log: runs/<time>.nccl-trace-rank0 (and .pipe)."""
    return f"{stem}.nccl-trace-rank"


def trace_env(prefix: str, env: dict[str, str]) -> dict[str, str]:
    """What a rank needs for the recorder and its pipe (`{prefix}{rank}.pipe` asks for a dump,
    written to `{prefix}{rank}`); the buffer size stays as `env` sets it, if it does."""
    size = env.get("TORCH_FR_BUFFER_SIZE") or env.get("TORCH_NCCL_TRACE_BUFFER_SIZE") \
        or TRACE_ENTRIES
    names = ("TORCH_FR_BUFFER_SIZE", "TORCH_FR_DUMP_TEMP_FILE") if _torch_at_least(2, 9) else \
        ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DEBUG_INFO_TEMP_FILE")
    # (torch 2.9 renamed the two and warns on every rank when the old names are set)
    return {names[0]: size, names[1]: prefix, "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": prefix}


def _torch_at_least(major: int, minor: int) -> bool:
    try:  # the installed version, without importing torch
        found = importlib.metadata.version("torch").split(".")[:2]
        return (int(found[0]), int(found[1])) >= (major, minor)
    except (importlib.metadata.PackageNotFoundError, ValueError, IndexError):
        return True


class FlightDumps:
    """ask(slot) writes to a rank's pipe; collect(now) gives each dump that came since."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.pending: dict[int, Awaited] = {}

    def ask(self, slot: int, now: float) -> bool:
        """False when the rank has no NCCL process group listening (CPU ranks, gloo, not yet
        formed): nothing is waited for."""
        path = f"{self.prefix}{slot}"
        try:
            if os.path.exists(path):
                os.remove(path)  # the last dump: a new one is written in its place
            fd = os.open(path + ".pipe", os.O_WRONLY | os.O_NONBLOCK)  # ENXIO: no reader
        except OSError:
            return False
        try:
            os.write(fd, b"1")
        finally:
            os.close(fd)
        self.pending[slot] = Awaited(path, now + DUMP_WAIT_S)
        return True

    def remove_pipes(self, slots: Iterable[int]) -> None:
        """The ranks' watchdogs leave their pipes behind: gone with the run (the dumps stay)."""
        for slot in slots:
            try:
                os.remove(f"{self.prefix}{slot}.pipe")
            except OSError:
                pass

    def collect(self, now: float) -> list[tuple[int, dict | None]]:
        """(slot, the dump's data) for each dump in since the last call; None: none came."""
        return settled_answers(self.pending, now, _load)


def summary(trace: dict | None) -> str | None:
    """'NCCL: in all_reduce #412 (started), process group default_pg' for the oldest collective
    that has not completed; else the last one, completed."""
    if not trace:
        return None
    entries = trace.get("entries") or []
    if not entries:
        return "NCCL: no collective recorded yet"
    e = _oldest_open(entries) or entries[-1]
    group = e.get("process_group")
    group = f", process group {group[1] or group[0]}" if isinstance(group, (list, tuple)) \
        and len(group) == 2 else ""
    if e.get("state") != "completed":
        return f"NCCL: in {_name(e)} #{_seq(e)} ({e.get('state')}){group}"
    return f"NCCL: in no collective; the last, {_name(e)} #{_seq(e)}, completed{group}"


def compact(trace: dict | None) -> dict | None:
    """What blame needs of a rank's dump, small enough to send over attach's link (a dump holds
    up to 2,000 entries with their C++ stacks): its summary, the last sequence number each
    process group enqueued, and the oldest collective still open there."""
    if not trace:
        return None
    entries = [e for e in trace.get("entries") or [] if not e.get("is_p2p")]
    # Collectives only: send/recv count in a sequence of their own.
    highest: dict[str, int] = {}
    for e in entries:
        highest[str(e.get("pg_id"))] = max(highest.get(str(e.get("pg_id")), 0), _seq(e))
    e = _oldest_open(entries)
    return {"summary": summary(trace), "highest": highest,
            "open": None if e is None else {"where": f"{_name(e)} #{_seq(e)} (NCCL)",
                                            "pg": str(e.get("pg_id")), "seq": _seq(e)}}


def behind(compacts: dict[int, dict]) -> dict[int, tuple[str, list[int]]]:
    """From several ranks' compact dumps (`compact`): a rank with a collective open (#N of a
    process group) waits for the ranks that never enqueued #N there; rank -> (where it waits,
    those ranks)."""
    waits = {}
    for rank, mine in compacts.items():
        e = mine.get("open")
        if e is None:
            continue
        late = sorted(other for other, theirs in compacts.items()
                      if other != rank and theirs["highest"].get(e["pg"], 0) < e["seq"])
        if late:
            waits[rank] = (e["where"], late)
    return waits


def _oldest_open(entries: list[dict]) -> dict | None:
    return next((e for e in entries if e.get("state") != "completed"), None)


def _name(e: dict) -> str:
    return str(e.get("profiling_name", "?")).removeprefix("nccl:")


def _seq(e: dict) -> int:
    return e.get("collective_seq_id") or e.get("p2p_seq_id") or 0


def _load(path: str) -> dict | None:
    try:
        with open(path, "rb") as f:
            trace = plain_data(f.read())
    except OSError:
        return None
    return trace if isinstance(trace, dict) else None
