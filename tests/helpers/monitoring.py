"""Real monitoring servers for the --metrics and --notify tests: Debian's Prometheus and
Alertmanager on free loopback ports, and a webhook receiver that keeps what is POSTed to it."""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
import urllib.error
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from tests.helpers.runs import local_port


class Receiver:
    """A webhook on 127.0.0.1: each POST's JSON body kept; `status` is what it answers."""

    def __init__(self):
        self.bodies: list[dict] = []
        self.status = 200
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                size = int(self.headers.get("Content-Length", 0))
                receiver.bodies.append(json.loads(self.rfile.read(size)))
                self.send_response(receiver.status)
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def get(url: str, headers: dict | None = None) -> tuple[int, str]:
    """(HTTP status, body); 0 where nothing listens."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                    timeout=10) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, ""
    except urllib.error.URLError:  # not listening (yet, or any more)
        return 0, ""


def until(check, seconds: float = 60):
    """check()'s first truthy answer within `seconds`, else its last."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.5)
    return check()


def query(base: str, expr: str) -> list:
    """A PromQL instant query through Prometheus' HTTP API: its result list."""
    status, body = get(f"{base}/api/v1/query?query={urllib.request.quote(expr)}")
    return json.loads(body)["data"]["result"] if status == 200 else []


class Servers:
    """Starts Prometheus and Alertmanager for a test (skipped where Debian's are missing)."""

    def __init__(self, folder):
        self.folder, self.procs = folder, []

    def prometheus(self, config: str) -> str:
        """Prometheus over `config` (prometheus.yml's text): its base URL."""
        _need("prometheus")
        port = local_port()
        (self.folder / "prometheus.yml").write_text(config)
        self._start(["prometheus", f"--config.file={self.folder / 'prometheus.yml'}",
                     f"--storage.tsdb.path={self.folder / 'tsdb'}",
                     f"--web.listen-address=127.0.0.1:{port}"])
        base = f"http://127.0.0.1:{port}"
        assert until(lambda: get(f"{base}/-/ready")[0] == 200, 60), "Prometheus never ready"
        return base

    def alertmanager(self, webhook: str) -> str:
        """Alertmanager sending every alert to `webhook` at once: its host:port."""
        _need("prometheus-alertmanager")
        port = local_port()
        (self.folder / "alertmanager.yml").write_text(
            "route: {receiver: hook, group_wait: 1s, group_interval: 1s, repeat_interval: 1h}\n"
            f"receivers: [{{name: hook, webhook_configs: [{{url: '{webhook}'}}]}}]\n")
        self._start(["prometheus-alertmanager",
                     f"--config.file={self.folder / 'alertmanager.yml'}",
                     f"--storage.path={self.folder / 'am'}",
                     f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="])
        assert until(lambda: get(f"http://127.0.0.1:{port}/-/ready")[0] == 200, 60)
        return f"127.0.0.1:{port}"

    def _start(self, argv: list[str]) -> None:
        self.procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL,
                                           stderr=subprocess.DEVNULL))

    def close(self) -> None:
        for p in self.procs:
            p.terminate()
            p.wait(30)


def _need(program: str) -> None:
    if shutil.which(program) is None:
        pytest.skip(f"Debian's {program} is not installed (.ci/run installs it)")
