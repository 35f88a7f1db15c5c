"""The layers point one way: the rank side (trainer/, on the rank kit) never imports the
dashboard side of ddptui, the dashboard draws its first screen without torch, and what runs in a
user's process never imports the top-level `trainer` (a project's own trainer.py would hide it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from tests.helpers.runs import ROOT

TRAINER_MODULES = ["trainer.rank_main", "trainer.bootstrap", "trainer.config", "trainer.loop"]
RANK_SIDE = ("ddptui.kit", "ddptui.contract")  # what a rank may take of ddptui


def _imported_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sys.modules))"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_importing_the_rank_side_imports_nothing_of_the_dashboard():
    loaded = _imported_after("\n".join(f"import {m}" for m in TRAINER_MODULES))
    assert "ddptui.kit.telemetry.reporter" in loaded
    assert not {m for m in loaded if m.startswith("ddptui.") and not m.startswith(RANK_SIDE)}


def test_the_dashboard_and_supervisor_start_without_torch():
    loaded = _imported_after("import ddptui.cli, ddptui.view.app, ddptui.run.supervisor, "
                             "ddptui.view.headless")
    assert "torch" not in loaded


def test_import_ddptui_in_a_users_script_is_light():
    """`import ddptui` in a training script brings neither Textual nor Rich (nor torch, which the
    script imports itself, nor a framework); ddptui.init() imports its API only when called."""
    loaded = _imported_after("import ddptui")
    assert not {m for m in loaded if m.split(".")[0] in ("textual", "rich", "torch", "lightning",
                                                         "transformers", "keras")}
    assert "ddptui.api" not in loaded


def test_a_wrapped_ranks_sidecar_starts_without_torch():
    """The sidecar beside each rank under `python -m ddptui.wrap` only watches: torch would cost
    it 1.8 CPU-s and a few hundred MB a rank."""
    assert "torch" not in _imported_after("import ddptui.wrap.sidecar")


def test_a_scripts_run_starts_without_torch():
    loaded = _imported_after("import ddptui.script.run, ddptui.script.options, ddptui.cli")
    assert "torch" not in loaded


USERS_PROCESS = ["ddptui.api", "ddptui.orders", "ddptui.rankside", "ddptui.loader",
                 "ddptui.elastic", "ddptui.rollback", "ddptui.figures", "ddptui.wrap.rankwatch",
                 "ddptui.wrap.sidecar", "ddptui.wrap", "ddptui.integrations.lightning",
                 "ddptui.integrations.transformers", "ddptui.integrations.keras"]


def test_what_runs_in_a_users_process_imports_no_top_level_trainer():
    loaded = _imported_after("import os\nos.environ['KERAS_BACKEND'] = 'torch'\n"
                             + "\n".join(f"import {m}" for m in USERS_PROCESS))
    assert "ddptui.kit.telemetry.reporter" in loaded
    assert not {m for m in loaded if m == "trainer" or m.startswith("trainer.")}


def test_the_import_contracts_hold_and_catch_an_upward_import_inside_a_function(tmp_path):
    """pyproject's import-linter contracts (make test runs lint-imports too) pass on the tree,
    and fail on a copy where the run model imports the view inside a function: an AST check of
    module-level imports let such an import through once."""
    lint = [os.path.join(os.path.dirname(sys.executable), "lint-imports"), "--no-cache"]
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    for name in ("ddptui", "trainer", "pyproject.toml"):
        copy = shutil.copytree if name != "pyproject.toml" else shutil.copy
        copy(os.path.join(ROOT, name), tmp_path / name)
    ok = subprocess.run(lint, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout[-3000:]
    model = tmp_path / "ddptui" / "state" / "epochs.py"
    model.write_text(model.read_text() + "\n\ndef _upward():\n    from ddptui.view import app\n")
    broken = subprocess.run(lint, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert broken.returncode != 0
    assert "ddptui.state.epochs -> ddptui.view.app" in broken.stdout
