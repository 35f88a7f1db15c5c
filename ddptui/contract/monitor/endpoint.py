"""--metrics: /metrics served on a thread of the process that holds the run's state, in
prometheus_client's own exposition (text, or OpenMetrics when the scraper asks), guarded by a
bearer token or basic auth where --metrics-auth names one.
"""

from __future__ import annotations

import base64
import gzip
import hmac
import socket
import threading
import time
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server


@dataclass(frozen=True)
class Auth:
    """What a scrape must present: `Authorization: Bearer TOKEN`, or basic auth USER:PASSWORD."""

    header: str  # the whole Authorization header expected

    @classmethod
    def of(cls, secret: str) -> Auth:
        """A file's line: USER:PASSWORD for basic auth, anything else a bearer token."""
        if ":" in secret:
            return cls("Basic " + base64.b64encode(secret.encode()).decode())
        return cls(f"Bearer {secret}")

    def allows(self, header: str) -> bool:
        return hmac.compare_digest(header.encode(), self.header.encode())


CACHE_S = 1.0


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scraper that hangs holds a thread, never the run's exit


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    timeout = 10  # a client that opens a connection and says nothing holds no thread for ever

    def log_message(self, format, *args) -> None:  # noqa: A002 (http.server's name)
        pass  # a scrape a second would fill the run's output


class MetricsEndpoint:
    """start() serves until close(); `port` is the one bound (0 asks for a free one). A scrape
    within CACHE_S of the last gets what that one rendered: a job of 512 ranks renders in a
    tenth of a second or more, and two Prometheus servers scraping it pay it once."""

    def __init__(self, address: tuple[str, int], collector, auth: Auth | None):
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(collector)
        self._lock = threading.Lock()
        self._cache: dict[str, tuple[float, bytes, bytes]] = {}  # type -> (when, text, gzipped)

        def app(environ, start_response):
            if auth and not auth.allows(environ.get("HTTP_AUTHORIZATION", "")):
                start_response("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="ddptui"'),
                                                    ("Content-Type", "text/plain")])
                return [b"unauthorized\n"]
            if environ.get("PATH_INFO", "/") not in ("/", "/metrics"):
                start_response("404 Not Found", [("Content-Type", "text/plain")])
                return [b"metrics are at /metrics\n"]
            return self._serve(environ, start_response)

        self.server = make_server(address[0], address[1], app,
                                  _Server6 if ":" in address[0] else _Server, _Quiet)
        self.host, self.port = address[0], self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="metrics",
                                        daemon=True)

    def _serve(self, environ, start_response):
        """prometheus_client's own encoders: the text format, or OpenMetrics when asked."""
        from prometheus_client.exposition import choose_encoder, gzip_accepted

        encoder, content_type = choose_encoder(environ.get("HTTP_ACCEPT", ""))
        with self._lock:
            when, text, packed = self._cache.get(content_type, (0.0, b"", b""))
            if time.monotonic() - when >= CACHE_S:
                text = encoder(self.registry)
                packed = gzip.compress(text, compresslevel=1)
                self._cache[content_type] = (time.monotonic(), text, packed)
        headers = [("Content-Type", content_type)]
        if gzip_accepted(environ.get("HTTP_ACCEPT_ENCODING", "")):
            headers.append(("Content-Encoding", "gzip"))
            text = packed
        start_response("200 OK", headers)
        return [text]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/metrics"

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve_metrics(plan, state, run: str) -> MetricsEndpoint | None:
    """The run's endpoint as --metrics planned it (contract/options/monitor.py), started and
    said in its events; None, said too, where its port was taken since it was checked."""
    from ddptui.contract.monitor.metrics import RunCollector

    try:
        endpoint = MetricsEndpoint((plan.host, plan.port), RunCollector(state, run),
                                   Auth.of(plan.secret) if plan.secret else None)
    except OSError as e:
        state.say(f"no metrics endpoint: {plan.host}:{plan.port}: {e.strerror or e}", "warning")
        return None
    endpoint.start()
    state.say(f"Prometheus metrics at {endpoint.url}" + (" (auth required)" if plan.secret
                                                          else ""))
    return endpoint
