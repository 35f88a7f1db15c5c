"""Asking a process for its stacks never ends it: the signal goes only to one with a handler."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

from ddptui.contract.observe.stacks import StackRequests, catches


def test_a_process_with_no_stacks_handler_is_not_asked_and_lives_on(tmp_path):
    bare = subprocess.Popen(["sleep", "60"])
    handled = subprocess.Popen([sys.executable, "-c", "import faulthandler, signal, sys, time; "
                                "faulthandler.register(signal.SIGUSR1, all_threads=True); "
                                "print('ready', flush=True); time.sleep(60)"],
                               stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        assert handled.stdout.readline() == "ready\n"
        asks = StackRequests()
        assert catches(bare.pid, signal.SIGUSR1) is False
        assert asks.ask(0, bare.pid, str(tmp_path / "bare.stacks"), 0.0) is False
        assert asks.ask(1, handled.pid, str(tmp_path / "handled.stacks"), 0.0) is True
        time.sleep(0.5)
        assert bare.poll() is None and handled.poll() is None
    finally:
        for p in (bare, handled):
            p.kill()
            p.wait()
