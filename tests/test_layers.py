"""The layers point one way: the rank side (trainer/) never imports the dashboard side (ddptui/),
and the dashboard draws its first screen without torch."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT

TRAINER_MODULES = ["trainer.rank_main", "trainer.bootstrap", "trainer.telemetry.remote",
                   "trainer.elastic.world", "trainer.config", "trainer.protocol.events",
                   "trainer.protocol.channel"]


def _imported_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sys.modules))"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_importing_the_rank_side_imports_nothing_of_the_dashboard():
    loaded = _imported_after("\n".join(f"import {m}" for m in TRAINER_MODULES))
    assert not {m for m in loaded if m == "ddptui" or m.startswith("ddptui.")}


def test_the_dashboard_and_supervisor_start_without_torch():
    loaded = _imported_after("import ddptui.cli, ddptui.view.app, ddptui.run.supervisor, "
                             "ddptui.view.headless")
    assert "torch" not in loaded


def test_import_ddptui_in_a_users_script_is_light():
    """`import ddptui` in a training script brings neither Textual nor Rich (nor torch, which the
    script imports itself, nor a framework); ddptui.init() imports its client only when called."""
    loaded = _imported_after("import ddptui")
    assert not {m for m in loaded if m.split(".")[0] in ("textual", "rich", "torch", "lightning",
                                                         "transformers", "keras")}
    assert "ddptui.client" not in loaded


def test_a_wrapped_ranks_sidecar_starts_without_torch():
    """The sidecar beside each rank under `python -m ddptui.wrap` only watches: torch would cost
    it 1.8 CPU-s and a few hundred MB a rank."""
    assert "torch" not in _imported_after("import ddptui.sidecar")


def test_a_scripts_run_starts_without_torch():
    loaded = _imported_after("import ddptui.script.run, ddptui.script.options, ddptui.cli")
    assert "torch" not in loaded
