"""A project with a `trainer` of its own (a trainer.py and a trainer/ package, common names)
beside its script: every way into ddptui runs from that folder, and the script's own
`import trainer` finds the project's. The top-level name was taken once (ddptui's rank kit was
loaded as `trainer`): every wrapped rank then failed with "'trainer' is not a package"."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers.runs import REPORT_KEY, ROOT, assert_gone, events, local_port

SMALL = ["--epochs", "1", "--samples", "64", "--image-size", "16"]


@pytest.fixture
def project(tmp_path) -> str:
    """The examples in a folder that has a trainer.py and a trainer/ package of its own; the
    scripts print what their `import trainer` found."""
    for name in ("plain_ddp.py", "with_ddptui.py", "elastic_ddp.py"):
        text = open(os.path.join(ROOT, "examples", name)).read()
        if name != "plain_ddp.py":
            text = text.replace("import ddptui\n", "import ddptui\nimport trainer\n\n"
                                "print('trainer:', trainer.NAME, flush=True)\n", 1)
        (tmp_path / name).write_text(text)
    (tmp_path / "trainer.py").write_text("NAME = \"the project's trainer.py\"\n")
    (tmp_path / "trainer").mkdir()
    (tmp_path / "trainer" / "__init__.py").write_text("NAME = \"the project's own\"\n")
    return str(tmp_path)


def _attached(env: dict, project: str, args: list[str]) -> list[dict]:
    """A torchrun job of 2 ranks started in the project with `args`, watched by attach."""
    listen, log = f"127.0.0.1:{local_port()}", os.path.join(project, f"attach-{local_port()}.jsonl")
    attach = subprocess.Popen([sys.executable, "-m", "ddptui", "attach", "--headless",
                               "--listen", listen, "--log", log], env=env, cwd=ROOT,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    job = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                          "--nproc-per-node", "2", *args, *SMALL],
                         env=dict(env, DDPTUI_REPORT=listen), cwd=project,
                         capture_output=True, text=True, timeout=120)
    if job.returncode != 0:  # attach would wait for the job's end for ever
        attach.kill()
        attach.wait()
        raise AssertionError(job.stderr[-2000:])
    _, err = attach.communicate(timeout=30)
    assert attach.returncode == 0, err
    return events(log)


@pytest.fixture
def keyed(env) -> dict:
    return dict(env, DDPTUI_AUTHKEY=REPORT_KEY, OMP_NUM_THREADS="1")


@pytest.mark.timeout(120)
def test_ddptui_run_with_the_whole_api_runs_beside_a_trainer_of_the_projects_own(keyed,
                                                                                 project):
    """ddptui run, with ddptui.init(), run.loader() and run.elastic() in every rank."""
    log = os.path.join(project, "own.jsonl")
    r = subprocess.run([os.path.join(os.path.dirname(sys.executable), "ddptui"), "run",
                        "elastic_ddp.py", "--cpus", "2", "--headless", "--log", log, "--",
                        *SMALL], env=keyed, cwd=project, capture_output=True, text=True,
                       timeout=100)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.count("trainer: the project's own") == 2
    opted = {e["rank"]: set(e["control"]) for e in events(log, "rank") if e.get("control")}
    assert opted.keys() == {0, 1} and all({"elastic", "settings"} <= c for c in opted.values())
    assert {e["rank"] for e in events(log, "epoch")} == {0, 1}


@pytest.mark.timeout(180)
@pytest.mark.parametrize("args, api", [(["-m", "ddptui.rank.wrap", "plain_ddp.py"], "ddptui.rank.wrap"),
                                       (["with_ddptui.py"], "ddptui.init")])
def test_torchrun_ranks_report_to_attach_beside_a_trainer_of_the_projects_own(keyed, project,
                                                                              args, api):
    """An unmodified script under torchrun through the wrapper, and the three lines under plain
    torchrun: each rank reports to attach."""
    evs = _attached(keyed, project, args)
    ranks = {e["rank"] for e in evs if e["kind"] == "rank" and e.get("api") == api}
    assert ranks == {0, 1}, args
    assert {e["rank"] for e in evs if e["kind"] == "epoch"} == {0, 1}, args
    assert_gone({e["pid"] for e in evs if e["kind"] == "rank" and e.get("pid")})
