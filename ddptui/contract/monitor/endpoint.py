"""--metrics: /metrics served on a thread of the process that holds the run's state, in
prometheus_client's own exposition (text, or OpenMetrics when the scraper asks), guarded by a
bearer token or basic auth where --metrics-auth names one.
"""

from __future__ import annotations

import base64
import hmac
import threading
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


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True  # a scraper that hangs holds a thread, never the run's exit


class _Quiet(WSGIRequestHandler):
    def log_message(self, format, *args) -> None:  # noqa: A002 (http.server's name)
        pass  # a scrape a second would fill the run's output


class MetricsEndpoint:
    """start() serves until close(); `port` is the one bound (0 asks for a free one)."""

    def __init__(self, address: tuple[str, int], collector, auth: Auth | None):
        from prometheus_client import CollectorRegistry, make_wsgi_app

        registry = CollectorRegistry(auto_describe=False)
        registry.register(collector)
        app = make_wsgi_app(registry)

        def guarded(environ, start_response):
            if auth and not auth.allows(environ.get("HTTP_AUTHORIZATION", "")):
                start_response("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="ddptui"'),
                                                    ("Content-Type", "text/plain")])
                return [b"unauthorized\n"]
            return app(environ, start_response)

        self.server = make_server(address[0], address[1], guarded, _Server, _Quiet)
        self.host, self.port = address[0], self.server.server_address[1]
        self._thread = threading.Thread(target=self.server.serve_forever, name="metrics",
                                        daemon=True)

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
