"""A run's --metrics endpoint and --notify messages together, in the process that holds its
state (the run's own for `ddptui run`, attach's for `ddptui attach --listen`).
"""

from __future__ import annotations

import sys

from ddptui.contract.monitor.endpoint import MetricsEndpoint, serve_metrics
from ddptui.contract.monitor.notify import Message, Notifier, deliver, masked, run_command
from ddptui.contract.monitor.watch import RunWatch
from ddptui.contract.options.monitor import MonitorPlan
from ddptui.contract.state.runstate import RunState


class Monitoring:
    """start() serves and watches; close() says the run's end and stops. `url`: the endpoint."""

    def __init__(self, plan: MonitorPlan, state: RunState, run: str, log: str):
        self.plan, self.state, self.run, self.log = plan, state, run, log
        self.endpoint: MetricsEndpoint | None = None
        self.notifier: Notifier | None = None
        self.watch: RunWatch | None = None

    @property
    def url(self) -> str:
        return self.endpoint.url if self.endpoint else ""

    def start(self) -> None:
        if self.plan.metrics:
            self.endpoint = serve_metrics(self.plan.metrics, self.state, self.run)
        if self.plan.notify or self.plan.notify_cmd:
            self.notifier = Notifier(list(self.plan.notify), self.plan.notify_cmd,
                                     lambda text: self.state.say(text, "warning"))
            self.watch = RunWatch(self.state, self.notifier.notify, self.run, self.log)
            self.watch.start()
            where = ", ".join([masked(u) for u in self.plan.notify] +
                              (["--notify-cmd"] if self.plan.notify_cmd else []))
            self.state.say(f"notifications to {where}")

    def close(self) -> None:
        if self.watch and self.notifier:
            self.watch.stop()  # the run's end, read once more
            self.notifier.close()
        if self.endpoint:
            self.endpoint.close()


def notify_test(plan: MonitorPlan, run: str) -> int:
    """--notify-test: one message to each URL and the command; 0 when all were delivered."""
    message = Message("test", f"ddptui: a test message for {run}: notifications reach you",
                      run)
    failed = 0
    for url in plan.notify:
        why = deliver(url, message)
        print(f"ddptui: {masked(url)}: " + ("delivered" if why is None else f"failed: {why}"),
              file=sys.stderr if why else sys.stdout)
        failed += why is not None
    if plan.notify_cmd:
        why = run_command(plan.notify_cmd, message)
        print(f"ddptui: {why}" if why else "ddptui: --notify-cmd ran",
              file=sys.stderr if why else sys.stdout)
        failed += why is not None
    return 1 if failed else 0
