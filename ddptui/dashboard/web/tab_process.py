"""A browser tab's process (`ddptui attach` that `ddptui web` started) ends with the server, however
the server ended: the tab notices that its input closed; the server kills what is left as it exits.
"""

from __future__ import annotations

import os
import select
import threading
from collections.abc import Callable

import psutil

WEB_TAB_ENV = "DDPTUI_WEB_TAB"  # set in a tab's process: its input is ddptui web's pipe
LEFT_S = 5.0  # for the tabs' processes to end once the server's pipes closed, before SIGKILL


def is_tab() -> bool:
    """This process is a tab's, started by `ddptui web`."""
    return os.environ.get(WEB_TAB_ENV) == "1"


def end_with_server(leave: Callable[[], None]) -> None:
    """Once the server's end of this process's input closes (it exited, or was killed), call
    `leave` and exit: nobody sees this dashboard any more."""

    def watch() -> None:
        poll = select.poll()
        poll.register(0, 0)  # no data asked for: only the pipe's hang-up is seen
        while not any(events & (select.POLLHUP | select.POLLERR | select.POLLNVAL)
                      for _fd, events in poll.poll()):
            pass
        leave()
        os._exit(0)  # the app's output goes nowhere now: nothing of it to wait for

    threading.Thread(target=watch, name="web-tab", daemon=True).start()


def tabs_left(pid: int) -> list[psutil.Process]:
    """The processes `pid` started that are still there, ended ones not reaped yet included."""
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def kill(processes: list[psutil.Process]) -> None:
    """SIGKILL, which costs the run nothing: a dashboard that goes is only a dashboard gone (a
    SIGTERM would end the run, as it does for a terminal's dashboard)."""
    for p in processes:
        try:
            p.kill()
        except psutil.Error:
            pass


def end_children(pid: int) -> None:
    """What is left of the tabs of server `pid` once its loop is closed: waited for, then
    killed."""
    _gone, alive = psutil.wait_procs(tabs_left(pid), timeout=LEFT_S)
    kill(alive)
    psutil.wait_procs(alive, timeout=LEFT_S)
