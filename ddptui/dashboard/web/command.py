"""`ddptui web [RUN]`: checks what it is given, binds its port, says where to point a browser
(and how, from another machine), then serves until the run ends (web/server.py).
"""

from __future__ import annotations

import argparse
import errno
import ipaddress
import socket

from ddptui.contract.options.errors import UsageError
from ddptui.contract.runs.registry import RunRecord, end_status, find, is_running, runs


def cmd_web(args: argparse.Namespace) -> int:
    try:
        from ddptui.dashboard.web.server import WebServer
    except ImportError:
        raise UsageError("ddptui web needs its extra: pip install 'ddptui[web]'") from None
    if args.max_viewers < 1:
        raise UsageError(f"--max-viewers must be at least 1, got {args.max_viewers}")
    if not 0 <= args.port <= 65535:
        raise UsageError(f"--port must be 0-65535, got {args.port}")
    try:
        record = find(args.run)
    except (LookupError, OSError) as e:
        raise UsageError(str(e)) from None
    sock = _bind(args.host, args.port)
    server = WebServer(record.name, sock, args.max_viewers, args.control,
                       lambda: is_running(record), lambda: _ended(record), args.host)
    _say_where(server, args.host, sock.getsockname()[1])
    server.serve()
    return server.exit_code


def _ended(record: RunRecord) -> str:
    """How the run ended, as `ddptui ls` says it: its record where the log could not say it
    (a full disk), else its log's last status."""
    said = next((r.state for r in runs() if r.name == record.name and r.pid == record.pid), None)
    return said if said and said != "running" else end_status(record.log)


def _bind(host: str, port: int) -> socket.socket:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise UsageError(f"--host {host}: {e.strerror}") from None
    family, _, _, _, address = infos[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
    except OSError as e:
        sock.close()
        why = "in use" if e.errno == errno.EADDRINUSE else e.strerror
        raise UsageError(f"cannot serve on {host}:{port}: {why} (--port 0 picks a free one)") \
            from None
    sock.listen(64)
    return sock


def _say_where(server, host: str, port: int) -> None:
    shown = f"[{host}]" if ":" in host else host
    base = f"http://{shown}:{port}/?token="
    print(f"ddptui: open {base}{server.tokens['view']} to watch {server.name} "
          "(read-only)", flush=True)
    if "control" in server.tokens:
        print(f"ddptui: open {base}{server.tokens['control']} to steer it (every key)",
              flush=True)
    print(f"ddptui: from another machine: ssh -L {port}:{shown if _loopback(host) else host}:"
          f"{port} {socket.gethostname()}, then the same URL with 127.0.0.1; Ctrl-C stops",
          flush=True)
    if not _loopback(host):
        print(f"ddptui: warning: --host {host} serves the dashboard beyond this machine: "
              "anyone who sees the URL (plain http) can watch, and with --control steer",
              flush=True)


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"

