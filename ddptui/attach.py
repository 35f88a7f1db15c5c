"""`ddptui attach`: the dashboard for ranks started by torchrun or srun with --report. It listens,
authenticates every connection, folds what arrives into a RunState, and relays commands to the
world's rank 0; the processes belong to their launcher, so it never starts or stops one.
"""

from __future__ import annotations

import threading
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener

from ddptui.runstate import RunState
from trainer.protocol.channel import MessageTooLong, handshake, receive, send
from trainer.protocol.events import PARENT, JsonlWriter, event, settings_request

DELEGATED = ("rank {rank} belongs to its launcher, not to ddptui: torchrun restarts the whole "
             "group when a rank fails (--max-restarts), srun ends the step; stop the job there "
             "(Ctrl-C to torchrun, scancel for SLURM)")


class Attach:
    """The source behind the dashboard: start(), steer like a Supervisor, stop() detaches."""

    live = True
    owns_ranks = False  # q detaches; training goes on

    def __init__(self, address: tuple[str, int], key: bytes, log_path: str, key_source: str):
        self.address, self.key, self.log_path = address, key, log_path
        self.state = RunState({"log": log_path, "model": "waiting for ranks",
                               "data": f"listening on {address[0]}:{address[1]}"})
        self.done = threading.Event()
        self.exit_code: int | None = None
        self.key_source = key_source
        self._listener = Listener(address)  # no authkey here: each handshake runs in its thread
        self._writer: JsonlWriter | None = None
        self._lock = threading.Lock()
        self._conns: dict[int, Connection] = {}  # rank -> its connection
        self._open: set[Connection] = set()
        self._finished = False

    def start(self) -> None:
        self._writer = JsonlWriter(self.log_path)
        self._note("info", f"listening on {self.address[0]}:{self.address[1]} "
                   f"(key: {self.key_source})")
        threading.Thread(target=self._accept, name="attach-accept", daemon=True).start()

    def wait(self, timeout: float | None = None) -> int | None:
        self.done.wait(timeout)
        return self.exit_code

    def stop(self, status: str = "interrupted", code: int = 130) -> None:
        """Detach: close the listener and every connection (the ranks keep training)."""
        if self.exit_code is None:
            self.exit_code = 0 if self._finished else code
        try:
            self._listener.close()
        except OSError:
            pass
        with self._lock:
            for conn in list(self._open):
                conn.close()
        if self._writer:
            self._writer.close()
        self.done.set()

    def pids(self) -> set[int]:
        return set()  # none of them are ours

    # -- steering: commands go to the world's rank 0, which agrees them with the others --------
    def pause(self) -> None:
        if self._command({"op": "pause"}):
            self._record(event("run", PARENT, status="pausing"))

    def resume(self) -> None:
        if self._command({"op": "resume"}):
            self._record(event("run", PARENT, status="resuming"))

    def checkpoint(self) -> None:
        self._command({"op": "checkpoint"})

    def apply_now(self) -> None:
        self._command({"op": "apply"})

    def change_settings(self, **settings) -> None:
        requested, cmd = settings_request(settings)
        if self._command(cmd):  # one that was never sent would stay pending in the view
            self._record(requested)

    def stop_rank(self, rank: int) -> None:
        self._note("warning", DELEGATED.format(rank=rank))

    def restart_rank(self, rank: int) -> None:
        self._note("warning", DELEGATED.format(rank=rank))

    def _command(self, cmd: dict) -> bool:
        with self._lock:
            conn = self._conns.get(0)
        if conn is None:
            self._note("warning", "rank 0 is not connected: the command was not sent")
            return False
        try:
            send(conn, cmd)
        except (OSError, ValueError):
            self._note("warning", "rank 0's connection broke: the command was not sent")
            return False
        return True

    # -- the connections ---------------------------------------------------------------------
    def _accept(self) -> None:
        while not self.done.is_set():
            try:
                conn = self._listener.accept()
            except OSError:  # closed by stop()
                return
            peer = _peer(self._listener)
            threading.Thread(target=self._serve, args=(conn, peer), name="attach-conn",
                             daemon=True).start()

    def _serve(self, conn: Connection, peer: str) -> None:
        try:
            handshake(conn, self.key)
        except (AuthenticationError, EOFError, OSError) as e:
            why = "wrong key" if isinstance(e, AuthenticationError) else "no handshake"
            self._note("warning", f"refused a connection from {peer}: {why}")
            conn.close()
            return
        with self._lock:
            self._open.add(conn)
        ranks: set[int] = set()
        try:
            while True:
                ev = receive(conn)
                if ev is None or "kind" not in ev:
                    continue  # malformed: dropped, the dashboard goes on
                ranks.add(ev["rank"])
                with self._lock:
                    self._conns.setdefault(ev["rank"], conn)
                self._record(ev)
        except MessageTooLong:
            self._note("warning", f"dropped the connection from {peer}: message over the size "
                       "limit")
        except OSError as e:
            if not self.done.is_set():  # after stop() every connection is closed on purpose
                self._note("warning", f"lost the connection from {peer}: {e.strerror or e}")
        except EOFError:
            pass
        finally:
            conn.close()
            with self._lock:
                self._open.discard(conn)
                for r in ranks:
                    if self._conns.get(r) is conn:
                        del self._conns[r]
            self._check_finished()

    def _record(self, ev: dict) -> None:
        self.state.apply(ev)
        if ev["kind"] == "run" and ev.get("status") in ("done", "failed"):
            self._finished = True
            self.exit_code = 0 if ev["status"] == "done" else 1
        if self._writer and not self.done.is_set():
            self._writer.write(ev)

    def _note(self, level: str, text: str) -> None:
        self._record(event("message", PARENT, level=level, text=text))

    def _check_finished(self) -> None:
        """The job said it ended and every connection has closed: attach is done too."""
        with self._lock:
            idle = not self._open
        if self._finished and idle and not self.done.is_set():
            self.stop(code=self.exit_code or 0)


def _peer(listener: Listener) -> str:
    addr = listener.last_accepted
    return f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
