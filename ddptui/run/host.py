"""A run ddptui owns, served to the dashboards that watch it: each viewer gets the run state as
it is, then every change to it; any viewer's orders steer the run. Lives in the run's process.
"""

from __future__ import annotations

import contextlib
import os
import queue
import socket
import threading
import time

from ddptui.contract.dashboards import malformed
from ddptui.contract.viewers import MAX_ORDER, Lines, frame, listen, peer_uid, socket_path
from ddptui.run.owned import OwnedRun
from ddptui.run.registry import folder, register, run_name
from ddptui.state.snapshot import dump
from ddptui.state.source import RunSource

FACES_S = 0.25  # how often what the keys may do is looked at again (a script opts in late)
BACKLOG = 1 << 16  # messages a viewer may lag behind before it is dropped (it can attach again)
END_GRACE_S = 5.0  # at the run's end: for each viewer to take the last of it
ACTIONS = ("pause", "settings", "checkpoint")  # what RunSource.refuse may refuse


def serve(run: OwnedRun) -> RunHost | None:
    """Record the run for `ddptui ls` and serve it on its socket, from this process; None (said
    in the run's events) where the user's runtime folder cannot be used."""
    try:
        host = RunHost(run, socket_path(folder(), os.getpid()), run_name(run.log_path))
    except OSError as e:
        run.state.say(f"no dashboard can attach to this run: {e}", "warning")
        register(run.log_path, run.state.meta)
        return None
    register(run.log_path, run.state.meta, host.path)
    host.start()
    return host


class RunHost:
    """Listens on `path` (a Unix socket, 0600, in the user's own folder) until close()."""

    def __init__(self, source: RunSource, path: str, name: str):
        self.source, self.path, self.name = source, path, name
        self.sock = listen(path)
        self._viewers: list[_Viewer] = []
        self._faces = self._read_faces()
        self._closing = threading.Event()
        source.state.listener = self._publish
        self._threads = [threading.Thread(target=self._accept, name="viewers", daemon=True),
                         threading.Thread(target=self._watch, name="faces", daemon=True)]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def watched(self) -> bool:
        """Whether a dashboard is attached now."""
        return any(not v.gone.is_set() for v in self._viewers)

    def close(self) -> None:
        """The run is over: every viewer gets its end and the last changes, then the socket
        goes."""
        self._closing.set()
        with self.source.state.lock:
            self.source.state.listener = None
            viewers, self._viewers = self._viewers, []
        end = frame({"type": "end", "exit_code": self.source.exit_code})
        for v in viewers:
            v.send(end)
            v.finish()
        deadline = time.monotonic() + END_GRACE_S
        for v in viewers:
            v.sender.join(max(0.0, deadline - time.monotonic()))
            v.drop()
        try:
            os.unlink(self.path)
        except OSError:
            pass
        self.sock.close()

    # -- viewers come and go ------------------------------------------------------------------
    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return  # closed
            uid = peer_uid(conn)
            if uid != os.getuid():  # the folder's mode keeps others out; this is the second lock
                conn.close()
                self.source.state.say(f"refused a dashboard of user {uid}", "warning")
                continue
            viewer = _Viewer(conn, self._order)
            state = self.source.state
            with state.lock:  # no change is lost or sent twice between the snapshot and the stream
                viewer.send(frame({"type": "hello", "name": self.name, "pid": os.getpid(),
                                   "log": self.source.log_path, "faces": self._faces,
                                   "snapshot": dump(state)}))
                self._viewers.append(viewer)
            viewer.start()

    def _publish(self, update: dict) -> None:
        """Each change to the run state (called under its lock): to every viewer, encoded once."""
        if not self._viewers:
            return
        try:
            data = frame(update)
        except (TypeError, ValueError):  # not JSON: the dashboards miss it, the run goes on
            return
        for v in list(self._viewers):
            if not v.send(data):
                self._viewers.remove(v)
                v.drop()

    def _watch(self) -> None:
        """What the keys may do changes as a script's ranks opt in; each change goes out."""
        while not self._closing.wait(FACES_S):
            faces = self._read_faces()
            if faces != self._faces:
                self._faces = faces
                with self.source.state.lock:
                    self._publish({"type": "faces", "faces": faces})
            with self.source.state.lock:
                self._viewers = [v for v in self._viewers if not v.gone.is_set()]

    def _read_faces(self) -> dict:
        s = self.source
        return {"can_steer": s.can_steer, "refuse": {a: s.refuse(a) for a in ACTIONS},
                "restarts_group": {k: s.restarts_group(k) for k in "srk"},
                "after_kill": s.after_kill}

    # -- orders --------------------------------------------------------------------------------
    def _order(self, order: dict | None) -> None:
        why = malformed(order)
        if why:
            self.source.state.say(f"a dashboard's message was dropped: {why}", "warning")
            return
        assert order is not None
        s, op = self.source, order["op"]
        match op:
            case "settings":
                s.change_settings(request=order.get("request"), **order["settings"])
            case "stop":
                s.stop(code=order["code"])
            case "restart_group":
                s.restart_group(kill=order["kill"])
            case "stop_rank" | "restart_rank" | "kill_rank" | "stacks":
                getattr(s, op)(order["rank"])
            case "apply":
                s.apply_now()
            case _:  # pause, resume, checkpoint
                getattr(s, op)()


class _Viewer:
    """One dashboard's connection: a thread sends what is queued for it, another reads its
    orders."""

    def __init__(self, conn: socket.socket, on_order):
        self.conn, self.on_order = conn, on_order
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.gone = threading.Event()
        self.sender = threading.Thread(target=self._send_loop, name="viewer-out", daemon=True)
        self.reader = threading.Thread(target=self._read_loop, name="viewer-in", daemon=True)

    def start(self) -> None:
        self.sender.start()
        self.reader.start()

    def send(self, data: bytes) -> bool:
        """Queue `data`; False when this viewer is gone or too far behind."""
        if self.gone.is_set() or self.queue.qsize() > BACKLOG:
            return False
        self.queue.put(data)
        return True

    def finish(self) -> None:
        self.queue.put(None)  # the sender closes after what is queued

    def drop(self) -> None:
        self.gone.set()
        self.queue.put(None)
        with contextlib.suppress(OSError):  # gone already
            self.conn.shutdown(socket.SHUT_RDWR)

    def _send_loop(self) -> None:
        try:
            while True:
                batch = [self.queue.get()]
                while not self.queue.empty() and len(batch) < 4096:
                    batch.append(self.queue.get())
                data = b"".join(b for b in batch if b is not None)
                if data:
                    self.conn.sendall(data)
                if None in batch:
                    return
        except OSError:
            pass  # the viewer went: its reader sees it too
        finally:
            self.gone.set()
            with contextlib.suppress(OSError):  # gone already
                self.conn.shutdown(socket.SHUT_WR)

    def _read_loop(self) -> None:
        try:
            for order in Lines(self.conn, MAX_ORDER):
                self.on_order(order)
        except OSError:
            pass  # gone, or a message over the bound: this viewer is dropped
        self.drop()
        self.conn.close()
