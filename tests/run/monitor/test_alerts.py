"""The shipped alert rules: promtool checks them and runs their unit tests, and a rank stopped
in a run that a real Prometheus scrapes fires RankStalled through a real Alertmanager to a
webhook."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess

import pytest

from tests.helpers.monitoring import Receiver, Servers, until
from tests.helpers.runs import ROOT, TINY, events, local_port, start_ddptui, wait_for_event

FOLDER = os.path.join(ROOT, "docs", "monitoring")


def test_promtool_checks_the_rules_and_runs_their_unit_tests():
    if shutil.which("promtool") is None:
        pytest.skip("Debian's promtool (package prometheus) is not installed (.ci/run installs it)")
    check = subprocess.run(["promtool", "check", "rules", "ddptui-alerts.yml"], cwd=FOLDER,
                           capture_output=True, text=True, timeout=60)
    assert check.returncode == 0 and "SUCCESS: 6 rules found" in check.stdout, check.stdout
    test = subprocess.run(["promtool", "test", "rules", "ddptui-alerts.test.yml"], cwd=FOLDER,
                          capture_output=True, text=True, timeout=60)
    assert test.returncode == 0 and "SUCCESS" in test.stdout, test.stdout + test.stderr


@pytest.mark.timeout(240)
def test_a_stopped_rank_fires_rank_stalled_through_alertmanager(env, tmp_path):
    servers, receiver = Servers(tmp_path), Receiver()
    port, log = local_port(), tmp_path / "a.jsonl"
    run = start_ddptui(["run", *TINY, "--cpus", "2", "--epochs", "2000", "--stall-after", "2",
                        "--log", str(log), "--metrics", str(port)], env, tmp_path)
    try:
        am = servers.alertmanager(receiver.url)
        servers.prometheus(
            "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
            f"rule_files: [{os.path.join(FOLDER, 'ddptui-alerts.yml')}]\n"
            f"alerting: {{alertmanagers: [{{static_configs: [{{targets: ['{am}']}}]}}]}}\n"
            "scrape_configs:\n  - job_name: ddptui\n"
            f"    static_configs: [{{targets: ['127.0.0.1:{port}']}}]\n")
        wait_for_event(log, lambda e: e["kind"] == "step", timeout=90)
        victim = next(e["pid"] for e in events(log, "rank") if e["rank"] == 1 and e.get("pid"))
        os.kill(victim, signal.SIGSTOP)
        fired = until(lambda: [a for b in receiver.bodies for a in b.get("alerts", [])
                               if a["labels"]["alertname"] == "RankStalled"
                               and a["status"] == "firing" and a["labels"]["rank"] == "1"], 120)
        assert fired, receiver.bodies
        labels = fired[0]["labels"]
        assert (labels["state"], labels["run"]) == ("stalled", "a")
        assert fired[0]["annotations"]["summary"].startswith("run a: rank 1 on ")
        os.kill(victim, signal.SIGCONT)
    finally:
        run.send_signal(signal.SIGINT)
        run.wait(90)
        servers.close()
        receiver.close()
