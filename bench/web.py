"""One browser tab of `ddptui web` against the terminal dashboard (`ddptui attach` in tmux), on
the same CPU run, alternating: memory (the tab's `ddptui attach` process and the web server),
time to the first full screen, and the time from a key (`?`: the help screen; escape closes it)
to the screen showing it, median and worst of N presses.

    python bench/web.py [--presses 10] [--rounds 2] [--chromium /usr/bin/chromium]

The browser's screen is a canvas: a key's screen is taken as the first bytes for it reaching the
page's WebSocket (the page draws them within a frame); the terminal's, as tmux's pane showing it.
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import psutil

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HELP = "ddptui keys"  # the help screen's title
FULL = "events"  # the last pane of the first screen to be drawn
# Every WebSocket message the page gets, timestamped, as text (the terminal's bytes).
HOOK = """
window.__frames = [];
const Real = window.WebSocket;
window.WebSocket = function (...args) {
  const ws = new Real(...args);
  ws.addEventListener("message", (m) => {
    const text = typeof m.data === "string" ? m.data
      : new TextDecoder("latin1").decode(new Uint8Array(m.data));
    window.__frames.push([performance.now(), text]);
  });
  return ws;
};
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presses", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = ap.parse_args()
    work = tempfile.mkdtemp(prefix="ddptui-web-bench-")
    env = dict(os.environ, XDG_RUNTIME_DIR=os.path.join(work, "rt"), PYTHONPATH=ROOT)
    log = os.path.join(work, "bench.jsonl")
    started = subprocess.run([sys.executable, "-m", "ddptui", "run", "resnet18", "--data",
                              "synthetic", "--cpus", "2", "--image-size", "32", "--batch-size",
                              "16", "--epochs", "1000", "--detach", "--log", log], env=env,
                             cwd=work, check=True, capture_output=True, text=True)
    run = int(re.search(r"\(pid (\d+)\)", started.stdout)[1])
    rows = []
    try:
        for _ in range(args.rounds):
            rows.append(("terminal", *terminal(env, args.presses)))
            rows.append(("browser", *browser(env, args.presses, args.chromium)))
    finally:
        os.kill(run, signal.SIGTERM)
    print("| dashboard | RSS, MiB (its process + server) | first screen, s | key to screen, "
          "median ms | worst ms |\n|---|---|---|---|---|")
    for name, rss, first, keys in rows:
        print(f"| {name} | {rss} | {first:.2f} | {statistics.median(keys):.0f} | "
              f"{max(keys):.0f} |")


def terminal(env: dict, presses: int) -> tuple[str, float, list[float]]:
    subprocess.run(["tmux", "kill-session", "-t", "webbench"], capture_output=True)
    t0 = time.monotonic()
    subprocess.run(["tmux", "new-session", "-d", "-s", "webbench", "-x", "160", "-y", "50",
                    f"{shlex.quote(sys.executable)} -m ddptui attach bench"], env=env, check=True)
    _until(lambda: FULL in _pane(), "the terminal's first screen")
    first = time.monotonic() - t0
    pane = int(subprocess.run(["tmux", "display", "-p", "-t", "webbench", "#{pane_pid}"],
                              capture_output=True, text=True).stdout)
    rss = _rss([pane])
    keys = []
    for _ in range(presses):
        t = time.monotonic()
        subprocess.run(["tmux", "send-keys", "-t", "webbench", "?"])
        _until(lambda: HELP in _pane(), "the help screen")
        keys.append(1000 * (time.monotonic() - t))
        subprocess.run(["tmux", "send-keys", "-t", "webbench", "Escape"])
        _until(lambda: HELP not in _pane(), "the help screen closed")
        time.sleep(0.3)
    subprocess.run(["tmux", "send-keys", "-t", "webbench", "d"])
    time.sleep(1)
    subprocess.run(["tmux", "kill-session", "-t", "webbench"], capture_output=True)
    return f"{rss:.0f}", first, keys


def browser(env: dict, presses: int, chromium: str) -> tuple[str, float, list[float]]:
    from playwright.sync_api import sync_playwright

    web = subprocess.Popen([sys.executable, "-m", "ddptui", "web", "bench", "--port", "0"],
                           env=env, stdout=subprocess.PIPE, text=True)
    url = re.search(r"open (\S+) to watch", web.stdout.readline())[1]
    try:
        with sync_playwright() as pw:
            b = pw.chromium.launch(executable_path=chromium, headless=True, args=["--no-sandbox"])
            page = b.new_page(viewport={"width": 1400, "height": 900})
            page.add_init_script(HOOK)
            t0 = time.monotonic()
            page.goto(url)
            page.wait_for_function(f"window.__frames.some(f => f[1].includes({FULL!r}))",
                                   timeout=60_000)
            first = time.monotonic() - t0
            tab = [p.pid for p in psutil.Process(web.pid).children(recursive=True)
                   if "attach" in p.cmdline()]
            rss = _rss(tab), _rss([web.pid])
            page.click(".xterm-screen")
            keys = []
            for _ in range(presses):
                seen = page.evaluate("window.__frames.length")
                start = page.evaluate("performance.now()")
                page.keyboard.press("?")
                page.wait_for_function(f"window.__frames.slice({seen}).some(f => "
                                       f"f[1].includes({HELP!r}))", timeout=30_000)
                shown = page.evaluate(f"window.__frames.slice({seen}).find(f => "
                                      f"f[1].includes({HELP!r}))[0]")
                keys.append(shown - start)
                page.keyboard.press("Escape")
                time.sleep(0.5)
            b.close()
    finally:
        web.terminate()
        web.wait(30)
    return f"{rss[0]:.0f} + {rss[1]:.0f}", first, keys


def _pane() -> str:
    return subprocess.run(["tmux", "capture-pane", "-p", "-t", "webbench"], capture_output=True,
                          text=True).stdout


def _rss(pids: list[int]) -> float:
    """MiB: the processes and their children."""
    total = 0
    for pid in pids:
        p = psutil.Process(pid)
        total += sum(q.memory_info().rss for q in [p, *p.children(recursive=True)])
    return total / 2**20


def _until(predicate, what: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.005)


if __name__ == "__main__":
    main()
