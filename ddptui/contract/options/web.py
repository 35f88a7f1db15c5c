"""`ddptui web`'s command line: which run, where to serve it, who may steer. Its command is
ddptui/dashboard/web/command.py; the grammar is here, where every process's parser is built.
"""

from __future__ import annotations

DEFAULT_PORT = 8470


def add_web_parser(sub) -> None:
    web = sub.add_parser("web", help="a run's dashboard in browser tabs, token-guarded, "
                         "read-only unless --control (pip install 'ddptui[web]')")
    web.add_argument("run", nargs="?", metavar="RUN",
                     help="a run `ddptui ls` lists as running: its name or a prefix of it "
                     "(default: the newest)")
    web.add_argument("--host", default="127.0.0.1",
                     help="the address to serve on (default 127.0.0.1: this machine only; "
                     "ssh -L reaches it from another)")
    web.add_argument("--port", type=int, default=DEFAULT_PORT,
                     help=f"its port (default {DEFAULT_PORT}; 0: a free one)")
    web.add_argument("--control", action="store_true",
                     help="print a second URL whose tabs steer the run as a terminal "
                     "dashboard does (the first URL's tabs only watch)")
    web.add_argument("--max-viewers", type=int, default=8, metavar="N",
                     help="tabs at once (default 8): each is a process of its own")
