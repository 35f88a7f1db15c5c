"""--metrics and --metrics-auth, for `ddptui run` (either form) and `ddptui attach --listen`:
declared once here, checked before anything starts (one line and exit 2 for what is wrong).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import stat
from dataclasses import dataclass

from ddptui.contract.monitor.notify import webhook
from ddptui.contract.options.errors import UsageError
from ddptui.contract.options.parser import option

INSTALL = "pip install prometheus_client"
NOTIFY_INSTALL = "pip install 'ddptui[notify]'"


@dataclass(frozen=True)
class MonitorOptions:
    """How a run is watched by those not looking at it (docs/monitoring.md)."""

    GROUP = "monitoring"
    metrics: str | None = option(
        None, "serve Prometheus metrics at http://[HOST:]PORT/metrics from the process that holds "
        "the run (a detached run keeps it; HOST defaults to 127.0.0.1; another address needs "
        "--metrics-auth)", metavar="[HOST:]PORT")
    metrics_auth: str | None = option(
        None, "a file (mode 0600) with one line: a bearer token, or USER:PASSWORD for basic "
        "auth, that every scrape must present", metavar="FILE")
    notify: tuple[str, ...] | None = option(
        None, "send a message when a rank stalls, crashes, straggles for a minute or comes "
        "back, and when the run ends: an Apprise URL (slack://, ntfy://, discord://, mailto://, "
        "pagerduty://, json://HOST/PATH; http(s):// is a JSON webhook); repeatable "
        f"({NOTIFY_INSTALL})", action="append", metavar="URL")
    notify_cmd: str | None = option(
        None, "run CMD (a shell command) on each of those, with DDPTUI_EVENT, DDPTUI_TEXT, "
        "DDPTUI_RUN, DDPTUI_RANK, DDPTUI_NODE, DDPTUI_CAUSE, DDPTUI_LOG and DDPTUI_HOST set",
        metavar="CMD")
    notify_test: bool = option(
        False, "send one test message to each --notify URL (and run --notify-cmd) and exit: 0 "
        "when every one was delivered, 1 otherwise", action="store_true")


@dataclass(frozen=True)
class MonitorPlan:
    """--metrics and --notify, checked."""

    metrics: MetricsPlan | None
    notify: tuple[str, ...]
    notify_cmd: str | None
    notify_test: bool


def monitor_plan(opts: MonitorOptions) -> MonitorPlan | None:
    """None where none of them was given; raises UsageError for anything wrong."""
    metrics = metrics_plan(opts)
    urls = tuple(opts.notify or ())
    if urls:
        try:
            import apprise
        except ImportError:
            raise UsageError(f"--notify needs Apprise: {NOTIFY_INSTALL}") from None
        for url in urls:
            if not apprise.Apprise().add(webhook(url)):
                raise UsageError(f"--notify {url.split('://')[0]}://…: not a URL Apprise knows "
                                 "(https://github.com/caronc/apprise/wiki)")
    if opts.notify_test and not (urls or opts.notify_cmd):
        raise UsageError("--notify-test sends to the --notify URLs and --notify-cmd: give one")
    if metrics is None and not urls and not opts.notify_cmd:
        return None
    return MonitorPlan(metrics, urls, opts.notify_cmd, opts.notify_test)


@dataclass(frozen=True)
class MetricsPlan:
    """Where to serve, checked: the address, and the secret a scrape must present (or None)."""

    host: str
    port: int
    secret: str | None


def metrics_plan(opts: MonitorOptions) -> MetricsPlan | None:
    """None without --metrics; raises UsageError for a bad address, a missing library, an open
    address without auth, an auth file others can read, or a port in use."""
    if opts.metrics is None:
        if opts.metrics_auth:
            raise UsageError("--metrics-auth goes with --metrics [HOST:]PORT")
        return None
    host, _, port = opts.metrics.rpartition(":")
    host = host.strip("[]") or "127.0.0.1"
    if not port.isdigit() or not 0 <= int(port) < 65536:
        raise UsageError(f"--metrics {opts.metrics}: expected [HOST:]PORT, e.g. 9464 or "
                         "0.0.0.0:9464")
    try:
        import prometheus_client  # noqa: F401 (only whether it is there)
    except ImportError:
        raise UsageError(f"--metrics needs prometheus_client: {INSTALL}") from None
    secret = _secret(opts.metrics_auth) if opts.metrics_auth else None
    if secret is None and not _loopback(host):
        raise UsageError(f"--metrics {opts.metrics} is open to other machines: give "
                         "--metrics-auth FILE (a bearer token or USER:PASSWORD), or serve on "
                         "127.0.0.1")
    _check_free(host, int(port), opts.metrics)
    return MetricsPlan(host, int(port), secret)


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _secret(path: str) -> str:
    try:
        mode = os.stat(path).st_mode
        with open(path) as f:
            secret = f.readline().strip()
    except OSError as e:
        raise UsageError(f"--metrics-auth {path}: {e.strerror}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise UsageError(f"--metrics-auth {path} is readable by others: chmod 600 {path}")
    if not secret:
        raise UsageError(f"--metrics-auth {path} is empty: one line, a token or USER:PASSWORD")
    return secret


def _check_free(host: str, port: int, given: str) -> None:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        raise UsageError(f"--metrics {given}: unknown host {host}") from None
    family, _, _, _, address = infos[0]
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(address)
        except OSError as e:
            raise UsageError(f"--metrics {given}: cannot listen there ({e.strerror})") from None
