"""--notify and --notify-cmd: a message when something happens to a run nobody watches, sent by
Apprise (Slack, ntfy, Discord, email, PagerDuty, a JSON webhook, ...) and to a command, from a
thread of its own: never in the way of a rank, the run or a dashboard.
"""

from __future__ import annotations

import os
import queue
import socket
import subprocess
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass, field

RETRIES_S = (2.0, 10.0, 30.0)  # waits before each retry of a failed delivery
QUIET_S = 300.0  # one message a rank and kind in this long; the rest go in a digest
CMD_S = 30.0  # a --notify-cmd that takes longer is ended


@dataclass(frozen=True)
class Message:
    """What happened, for people (`text`) and for tools (the rest, a JSON webhook's fields)."""

    event: str  # stalled | crashed | straggler | restarted | done | failed | interrupted | test
    text: str
    run: str
    rank: int | None = None
    node: str = ""
    cause: str = ""
    log: str = ""
    host: str = field(default_factory=socket.gethostname)

    @property
    def fields(self) -> dict[str, str]:
        return {"run": self.run, "event": self.event, "rank": "" if self.rank is None
                else str(self.rank), "node": self.node, "cause": self.cause, "log": self.log,
                "host": self.host}


def webhook(url: str) -> str:
    """An http(s):// URL is a JSON webhook: Apprise's json(s):// plugin."""
    for plain, ours in (("http://", "json://"), ("https://", "jsons://")):
        if url.startswith(plain):
            return ours + url[len(plain):]
    return url


def masked(url: str) -> str:
    """A URL as the log and the screen show it: the service and host, never a token."""
    try:
        import apprise

        servers = apprise.Apprise()
        if servers.add(webhook(url)):
            return next(iter(servers)).url(privacy=True).split("?")[0]
    except ImportError:
        pass
    return url.split("://")[0] + "://…"


def deliver(url: str, message: Message) -> str | None:
    """Send once; None when delivered, else why not (Apprise's own words, without the URL)."""
    import apprise

    target = webhook(url)
    if target.startswith(("json://", "jsons://")):  # the fields beside the text
        extras = {":message": "text", **{f":{k}": v for k, v in message.fields.items()}}
        target += ("&" if "?" in target else "?") + urllib.parse.urlencode(
            extras, quote_via=urllib.parse.quote)
    servers = apprise.Apprise()
    if not servers.add(target):
        return "not a URL Apprise knows"
    with apprise.LogCapture(level=apprise.logging.WARNING) as said:
        sent = servers.notify(body=message.text, title=f"ddptui: {message.run}: "
                              f"{message.event}")
    if sent:
        return None
    return (said.getvalue().strip().splitlines() or ["not delivered"])[-1].split(" - ")[-1]


class Notifier:
    """notify(message) queues it; a thread delivers it to every URL and the command, retrying a
    receiver that fails (RETRIES_S), one line through `warn` when it gives up. A rank's message
    of a kind it sent in the last QUIET_S is held for a digest instead."""

    def __init__(self, urls: list[str], cmd: str | None, warn: Callable[[str], None]):
        self.urls, self.cmd, self.warn = urls, cmd, warn
        self._queue: queue.Queue[Message | None] = queue.Queue()
        self._last: dict[tuple, float] = {}  # (rank, event) -> when its last message went
        self._held: list[Message] = []  # for the digest
        self._held_since = 0.0
        self._thread = threading.Thread(target=self._run, name="notify", daemon=True)
        self._thread.start()

    def notify(self, message: Message) -> None:
        self._queue.put(message)

    def close(self, timeout: float = 15.0) -> None:
        """Deliver what is queued (the run's end among it), for at most `timeout` s."""
        self._queue.put(None)
        self._thread.join(timeout)

    def _run(self) -> None:
        while True:
            try:
                message = self._queue.get(timeout=10.0)
            except queue.Empty:
                self._digest()
                continue
            if message is None:
                self._digest(final=True)
                return
            if self._quiet(message):
                continue
            self._send(message)
            self._digest()

    def _quiet(self, message: Message) -> bool:
        """Whether it is held: a flapping rank's second message of a kind within QUIET_S."""
        if message.rank is None:
            return False
        key, now = (message.rank, message.event), time.monotonic()
        if now - self._last.get(key, -QUIET_S) < QUIET_S:
            if not self._held:
                self._held_since = now
            self._held.append(message)
            return True
        self._last[key] = now
        return False

    def _digest(self, final: bool = False) -> None:
        if not self._held or not final and time.monotonic() - self._held_since < QUIET_S:
            return
        held, self._held = self._held, []
        kinds: dict[str, int] = {}
        for m in held:
            what = f"rank {m.rank} {m.event}"
            kinds[what] = kinds.get(what, 0) + 1
        text = f"{len(held)} more: " + ", ".join(f"{k} x{n}" if n > 1 else k
                                                  for k, n in kinds.items())
        self._send(Message("digest", text, held[0].run, log=held[0].log))

    def _send(self, message: Message) -> None:
        for url in self.urls:
            why = deliver(url, message)
            for wait in RETRIES_S:
                if why is None:
                    break
                time.sleep(wait)
                why = deliver(url, message)
            if why is not None:
                self.warn(f"notification to {masked(url)} not delivered after "
                          f"{len(RETRIES_S) + 1} tries: {why}")
        if self.cmd:
            self._command(message)

    def _command(self, message: Message) -> None:
        why = run_command(self.cmd or "", message)
        if why:
            self.warn(why)


def run_command(cmd: str, message: Message) -> str | None:
    """--notify-cmd for one message; None when it ran and exited 0, else what went wrong."""
    env = {**os.environ, "DDPTUI_TEXT": message.text,
           **{f"DDPTUI_{k.upper()}": v for k, v in message.fields.items()}}
    try:
        done = subprocess.run(cmd, shell=True, env=env, timeout=CMD_S, stdin=subprocess.DEVNULL,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"--notify-cmd took over {CMD_S:.0f} s: ended"
    except OSError as e:
        return f"--notify-cmd could not run: {e.strerror or e}"
    return f"--notify-cmd exited {done.returncode}" if done.returncode else None
