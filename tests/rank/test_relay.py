"""A node's relay: 4 torchrun "nodes" of 2 wrapped gloo ranks each report to one `ddptui attach`
over one connection a node; `t` and `K` reach a rank through its relay; a relay killed makes its
node's ranks unreachable until each reports again directly; nothing is left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from ddptui.dashboard.sources.attach import Attach
from tests.helpers.runs import REPORT_KEY, ROOT, assert_gone, events, local_port, wait_for_event

PLAIN = os.path.join(ROOT, "examples", "plain_ddp.py")
SMALL = ["--samples", "256", "--image-size", "16", "--epochs", "400"]
NODES, PER_NODE = 4, 2


def _node(node_rank: int, rdzv: int, env: dict, cwd) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(NODES), "--node-rank",
         str(node_rank), "--nproc-per-node", str(PER_NODE), "--rdzv-backend", "c10d",
         "--rdzv-endpoint", f"127.0.0.1:{rdzv}", "--rdzv-id", "relay-test", "-m", "ddptui.wrap",
         PLAIN, *SMALL], env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        text=True, start_new_session=True)


def _links(port: int) -> int:
    """attach's connections from the job: its listening port's established ones."""
    return sum(1 for c in psutil.Process().net_connections("tcp")
               if c.laddr and c.laddr.port == port and c.status == psutil.CONN_ESTABLISHED)


def _until_links(port: int, n: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while _links(port) != n:
        assert time.monotonic() < deadline, f"{_links(port)} connections to attach, not {n}"
        time.sleep(0.2)


def _sidecars(pids: set[int]) -> set[int]:
    found = set()
    for pid in pids:
        try:
            found |= {c.pid for c in psutil.Process(pid).children()
                      if "ddptui.rank.wrap.sidecar" in " ".join(c.cmdline())}
        except psutil.Error:
            pass
    return found


def _relays(port: int) -> dict[str, psutil.Process]:
    """node -> its relay's process, of the relays that report to `port`."""
    found = {}
    for p in psutil.process_iter(["cmdline"]):
        args = p.info["cmdline"] or []
        if "ddptui.rank.wrap.relay" in " ".join(args[:3]) and f"127.0.0.1:{port}" in args:
            found[args[args.index("--node") + 1]] = p
    return found


@pytest.mark.timeout(300)
def test_four_nodes_of_two_ranks_report_through_one_relay_a_node(keyed_env, tmp_path):
    port, rdzv = local_port(), local_port()
    log, scratch = tmp_path / "a.jsonl", tmp_path / "tmp"
    scratch.mkdir()
    attach = Attach(("127.0.0.1", port), REPORT_KEY.encode(), str(log), "test", stall_after=60)
    attach.start()
    env = dict(keyed_env, DDPTUI_REPORT=f"127.0.0.1:{port}", TMPDIR=str(scratch))
    nodes = [_node(n, rdzv, env, tmp_path) for n in range(NODES)]
    pids: set[int] = set()
    try:
        for rank in range(NODES * PER_NODE):
            wait_for_event(log, lambda e, r=rank: e["kind"] == "step" and e["rank"] == r, 150)
        ranks = {e["rank"]: e for e in events(log, "rank") if e.get("api") == "ddptui.rank.wrap"}
        by_node: dict[str, set[int]] = {}
        for r, e in ranks.items():
            by_node.setdefault(e["node"], set()).add(r)
        assert len(by_node) == NODES and all(len(v) == PER_NODE for v in by_node.values())
        relays = _relays(port)
        assert set(relays) == set(by_node)
        pids = {e["pid"] for e in ranks.values()}
        pids |= _sidecars(pids) | {p.pid for p in relays.values()}
        _until_links(port, NODES)  # one connection a node, not one a rank

        attach.stacks(5)  # t: the order goes to rank 5 through its node's relay
        stacks = wait_for_event(log, lambda e: e.get("stacks_of") == 5 and e.get("stacks"), 60)
        assert "plain_ddp.py" in stacks["stacks"]

        node = ranks[5]["node"]
        cut = by_node[node]
        relays[node].kill()  # its node's ranks: unreachable at once, then back directly
        relays[node].wait(30)  # reaped by the sidecar that started it, which lives on
        assert not psutil.pid_exists(relays[node].pid)
        for r in cut:
            gone = wait_for_event(log, lambda e, r=r: e["kind"] == "rank" and e["rank"] == r
                                  and e["state"] == "unreachable", 30)
            assert gone["reason"] == (f"node {node}'s relay went away: waiting for the rank to "
                                      "report directly")
            wait_for_event(log, lambda e, r=r: e["kind"] == "rank" and e["rank"] == r
                           and e["state"] == "running" and e.get("reason") == "reporting again", 60)
        back = time.time()
        for r in cut:  # training on, reported directly
            wait_for_event(log, lambda e, r=r: e["kind"] == "step" and e["rank"] == r
                           and e["t"] > back, 60)
        _until_links(port, NODES - 1 + PER_NODE)
        others = set(range(NODES * PER_NODE)) - cut
        assert not [e for e in events(log, "rank") if e["rank"] in others
                    and "relay" in e.get("reason", "")]

        attach.end_job()  # K: through the relays that are left, and directly
        for n in nodes:
            n.communicate(timeout=120)
        assert attach.done.wait(60)
        ends = {e["rank"] for e in events(log, "rank") if e["state"] in ("crashed", "done")}
        assert ends == set(range(NODES * PER_NODE))
    finally:
        attach.stop()
        for n in nodes:
            if n.poll() is None:
                os.killpg(n.pid, signal.SIGTERM)
                n.communicate(timeout=60)
    # Not unreachable at its end: every relay that was left served its ranks' last words.
    assert not [e for e in events(log, "rank") if "relay" in e.get("reason", "")
                and e["rank"] not in cut]
    assert_gone(pids | {p.pid for p in _relays(port).values()})
    # Each wrapper's folder of stacks and dumps went with it.
    assert not [p.name for p in scratch.iterdir() if p.name.startswith("ddptui-")]
