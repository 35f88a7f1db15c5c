"""`--metrics`: a run's figures scraped by a real Prometheus (Debian's, started here), guarded
where asked, and every bad flag one line and exit 2 before anything starts."""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import socket
import urllib.error
import urllib.request

import pytest

from tests.helpers.monitoring import Servers, get, query, until
from tests.helpers.runs import (
    ROOT,
    TINY,
    assert_gone,
    ddptui,
    local_port,
    rank_pids,
    start_ddptui,
    wait_for_event,
)

RULES = os.path.join(ROOT, "docs", "monitoring", "ddptui-alerts.yml")
DASHBOARD = os.path.join(ROOT, "docs", "monitoring", "grafana-dashboard.json")


@pytest.fixture
def servers(tmp_path):
    found = Servers(tmp_path)
    yield found
    found.close()


def _scraping(target: str, headers: str = "") -> str:
    """prometheus.yml: a scrape of `target` every second, with the shipped rules."""
    return (f"global: {{scrape_interval: 1s, evaluation_interval: 1s}}\n"
            f"rule_files: [{RULES}]\n"
            f"scrape_configs:\n  - job_name: ddptui\n{headers}"
            f"    static_configs: [{{targets: ['{target}']}}]\n")


@pytest.mark.timeout(180)
def test_a_run_is_scraped_by_prometheus_and_leaves_nothing(env, tmp_path, servers):
    port = local_port()
    log = tmp_path / "m.jsonl"
    run = start_ddptui(["run", *TINY, "--cpus", "2", "--epochs", "2000", "--log", str(log),
                        "--metrics", str(port)], env, tmp_path)
    try:
        wait_for_event(log, lambda e: e["kind"] == "step", timeout=90)
        status, text = get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and 'ddptui_rank_state{local_rank="1"' in text
        asked = urllib.request.Request(f"http://127.0.0.1:{port}/metrics", headers={
            "Accept": "application/openmetrics-text; version=1.0.0"})
        with urllib.request.urlopen(asked, timeout=10) as r:  # OpenMetrics when asked for it
            assert "openmetrics" in r.headers["Content-Type"] and r.read().endswith(b"# EOF\n")
        base = servers.prometheus(_scraping(f"127.0.0.1:{port}"))
        steps = until(lambda: len(query(base, "ddptui_steps_total")) == 2 and
                       query(base, "ddptui_steps_total"), 60)
        assert steps and {s["metric"]["rank"] for s in steps} == {"0", "1"}
        assert {s["metric"]["run"] for s in steps} == {"m"}
        rates = until(lambda: len(got := query(base, "rate(ddptui_samples_total[10s]) > 0")) == 2
                      and got, 30)
        assert rates and {r["metric"]["rank"] for r in rates} == {"0", "1"}
        running = query(base, 'ddptui_rank_state{state="running"} == 1')
        assert len(running) == 2
        phases = until(lambda: len(got := query(base, 'ddptui_step_phase_seconds{phase="comm"}'))
                       == 2 and got, 30)  # where each rank's step time goes
        assert phases and {p["metric"]["rank"] for p in phases} == {"0", "1"}
        assert len(query(base, 'ddptui_rank_memory_bytes{kind="peak"} > 0')) == 2
        info = query(base, "ddptui_run_info")
        assert info[0]["metric"]["model"] == TINY[0] and info[0]["metric"]["world_size"] == "2"
        _assert_shipped_queries_work(base, text)
        rules = get(f"{base}/api/v1/rules")[1]
        assert {r["name"] for g in json.loads(rules)["data"]["groups"] for r in g["rules"]} == {
            "RankStalled", "NoStepFor", "Straggler", "InputBound", "RankCrashed", "RunFailed"}
        ls = ddptui(["ls"], env, tmp_path)
        assert f"http://127.0.0.1:{port}/metrics" in ls.stdout
        pids = rank_pids(log) | {run.pid}
    finally:
        run.send_signal(signal.SIGINT)
        run.wait(90)
    assert_gone(pids)
    with pytest.raises(OSError):  # the endpoint went with the run
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


def _assert_shipped_queries_work(base: str, scraped: str) -> None:
    """The Grafana dashboard's and the alert rules' queries name only what the endpoint serves,
    and Prometheus takes each (the dashboard's variables as Grafana fills them for All)."""
    served = set(re.findall(r"^# TYPE (\S+)", scraped, re.M))
    with open(DASHBOARD) as f:
        dashboard = json.load(f)
    with open(RULES) as f:
        shipped = f.read() + json.dumps(dashboard)
    names = set(re.findall(r"ddptui_[a-z_]+", shipped))
    unknown = {n for n in names if n not in served and re.sub(r"_(bucket|sum|count)$", "", n)
               not in served}
    assert not unknown, unknown
    for panel in dashboard["panels"]:
        expr = panel["targets"][0]["expr"].replace("$run", ".*").replace("$node", ".*") \
            .replace("$rank", ".*")
        status, body = get(f"{base}/api/v1/query?query={urllib.request.quote(expr)}")
        assert status == 200 and json.loads(body)["status"] == "success", (panel["title"], body)


@pytest.mark.timeout(180)
def test_a_guarded_endpoint_refuses_a_scrape_without_its_secret(env, tmp_path, servers):
    port = local_port()
    auth = tmp_path / "auth"
    auth.write_text("scraper:s3cret\n")
    auth.chmod(0o600)
    log = tmp_path / "g.jsonl"
    run = start_ddptui(["run", *TINY, "--cpus", "2", "--epochs", "2000", "--log", str(log),
                        "--metrics", f"0.0.0.0:{port}", "--metrics-auth", str(auth)], env,
                       tmp_path)
    try:
        wait_for_event(log, lambda e: e["kind"] == "step", timeout=90)
        assert get(f"http://127.0.0.1:{port}/metrics")[0] == 401
        wrong = base64.b64encode(b"scraper:guess").decode()
        assert get(f"http://127.0.0.1:{port}/metrics", {"Authorization": f"Basic {wrong}"}
                    )[0] == 401
        (tmp_path / "password").write_text("s3cret")
        base = servers.prometheus(_scraping(f"127.0.0.1:{port}", "    basic_auth: {username: "
                                            f"scraper, password_file: {tmp_path / 'password'}}}\n"))
        assert until(lambda: len(query(base, "ddptui_steps_total")) == 2, 60)
    finally:
        run.send_signal(signal.SIGINT)
        run.wait(90)


def test_bad_metrics_flags_are_one_line_and_exit_2(env, tmp_path):
    open_auth = tmp_path / "open"
    open_auth.write_text("token\n")
    open_auth.chmod(0o644)
    held = socket.create_server(("127.0.0.1", 0))
    busy = held.getsockname()[1]
    cases = {
        ("--metrics", "nine"): "expected [HOST:]PORT",
        ("--metrics", "0.0.0.0:9464"): "open to other machines: give --metrics-auth",
        ("--metrics", str(busy)): "cannot listen there",
        ("--metrics", "9464", "--metrics-auth", str(open_auth)): "readable by others",
        ("--metrics-auth", str(open_auth)): "--metrics-auth goes with --metrics",
    }
    try:
        for flags, said in cases.items():
            out = ddptui(["run", *TINY, "--cpus", "2", "--headless", *flags], env, tmp_path)
            assert out.returncode == 2, (flags, out.stderr)
            assert said in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
            assert "Traceback" not in out.stderr
    finally:
        held.close()
    assert not (tmp_path / "runs").exists()  # nothing was started, no log claimed


@pytest.mark.timeout(120)
def test_attach_serves_a_cluster_jobs_metrics_with_each_ranks_node(keyed_env, tmp_path):
    """`ddptui attach --listen --metrics`: ranks reporting from two nodes (as wrapped ranks speak)
    are series labelled with their node and local rank; a GPU's with its UUID and host."""
    from ddptui.contract.channel import connect, send
    from ddptui.contract.protocol import events as ev
    from tests.helpers.runs import REPORT_KEY

    listen, port = f"127.0.0.1:{local_port()}", local_port()
    attach = start_ddptui(["attach", "--headless", "--listen", listen, "--log",
                           str(tmp_path / "a.jsonl"), "--metrics", str(port)], keyed_env, tmp_path)
    conns = []
    try:
        assert until(lambda: get(f"http://127.0.0.1:{port}/metrics")[0] == 200, 30)
        for rank, node in ((0, "gpu-a/0"), (1, "gpu-b/1")):
            conn = connect(("127.0.0.1", int(listen.rsplit(":", 1)[1])), REPORT_KEY.encode())
            conns.append(conn)
            for e in (ev.Rank(rank=rank, state="running", pid=100 + rank, local_rank=0,
                              api="ddptui.rank.wrap"),
                      ev.Step(rank=rank, epoch=0, step=3, global_step=3, loss=0.5, steps=3,
                              samples_per_s=100.0, step_ms=10.0, data_wait=0.1),
                      ev.Gpu(rank=rank, gpu=0, util=90.0, mem_used=1024, mem_total=81559,
                             uuid=f"GPU-{rank}")):
                send(conn, e.replace(node=node))
        text = until(lambda: 'ddptui_steps_total{local_rank="0",node="gpu-b/1"' in
                      (got := get(f"http://127.0.0.1:{port}/metrics")[1]) and got, 30)
        assert text and 'ddptui_steps_total{local_rank="0",node="gpu-a/0",rank="0"' in text
        assert 'ddptui_gpu_utilization_ratio{gpu="0",hostname="gpu-b",node="gpu-b/1",' \
               'run="a",uuid="GPU-1"} 0.9' in text
    finally:
        for conn in conns:
            conn.close()
        attach.send_signal(signal.SIGINT)
        attach.wait(30)
