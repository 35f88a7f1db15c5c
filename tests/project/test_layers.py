"""The layers point one way (pyproject's import-linter contracts, which see every import, also
those inside functions), the processes that must start light do (no torch, no Textual), and the
package list installs every folder."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib

from tests.helpers.runs import ROOT


def _imported_after(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", f"{code}\nimport sys\nprint(' '.join(sys.modules))"],
                         cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return set(out.split())


def test_the_dashboard_and_supervisor_start_without_torch():
    loaded = _imported_after("import ddptui.cli, ddptui.dashboard.view.app, ddptui.run.builtin.supervisor, "
                             "ddptui.contract.console")
    assert "torch" not in loaded
    assert not {"aiohttp", "textual_serve"} & loaded  # ddptui web's, loaded by it alone


def test_import_ddptui_in_a_users_script_is_light():
    """`import ddptui` in a training script brings neither Textual nor Rich (nor torch, which the
    script imports itself, nor a framework); ddptui.init() imports its API only when called."""
    loaded = _imported_after("import ddptui")
    assert not {m for m in loaded if m.split(".")[0] in ("textual", "rich", "torch", "lightning",
                                                         "transformers", "keras")}
    assert "ddptui.rank.api.session" not in loaded


def test_the_names_users_type_import_and_bring_no_dashboard():
    """README's names (`from ddptui.integrations.transformers import DdptuiCallback`,
    `python -m ddptui.wrap`) whatever the folders inside: moving them broke every script and
    job line written for them. They load the rank's side alone."""
    loaded = _imported_after("from ddptui.integrations.transformers import DdptuiCallback; "
                             "import ddptui.wrap")
    assert "ddptui.rank.integrations.transformers" in loaded and "ddptui.rank.wrap.runner" not in loaded
    assert not {m for m in loaded if m.split(".")[0] == "textual" or
                m.startswith(("ddptui.dashboard", "ddptui.run."))}
    r = subprocess.run([sys.executable, "-m", "ddptui.wrap"], capture_output=True, text=True,
                       cwd=ROOT, timeout=60)
    assert r.returncode == 2 and r.stderr.startswith("usage: python -m ddptui.wrap SCRIPT.py")


def test_a_wrapped_ranks_sidecar_starts_without_torch():
    """The sidecar beside each rank under `python -m ddptui.wrap` only watches: torch would cost
    it 1.8 CPU-s and a few hundred MB a rank."""
    assert "torch" not in _imported_after("import ddptui.rank.wrap.sidecar")


def test_a_scripts_run_starts_without_torch():
    loaded = _imported_after("import ddptui.run.script.run, ddptui.contract.options.script, ddptui.cli")
    assert "torch" not in loaded


def test_the_import_contracts_hold_and_catch_an_upward_import_inside_a_function(tmp_path):
    """pyproject's import-linter contracts (make test runs lint-imports too) pass on the tree,
    and fail on a copy where the floor's run model imports the view, and the run's process a
    dashboard's module, each inside a function: an AST check of module-level imports let such an
    import through once."""
    lint = [os.path.join(os.path.dirname(sys.executable), "lint-imports"), "--no-cache"]
    env = dict(os.environ, PYTHONPATH=str(tmp_path))
    shutil.copytree(os.path.join(ROOT, "ddptui"), tmp_path / "ddptui")
    shutil.copytree(os.path.join(ROOT, "trainer"), tmp_path / "ddptui_trainer")
    shutil.copy(os.path.join(ROOT, "pyproject.toml"), tmp_path)
    ok = subprocess.run(lint, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert ok.returncode == 0, ok.stdout[-3000:]
    model = tmp_path / "ddptui" / "contract" / "state" / "epochs.py"
    model.write_text(model.read_text() + "\n\ndef _upward():\n    from ddptui.dashboard.view import app\n")
    owned = tmp_path / "ddptui" / "run" / "owned.py"
    owned.write_text(owned.read_text() + "\n\ndef _across():\n    from ddptui.dashboard import background\n")
    broken = subprocess.run(lint, cwd=tmp_path, env=env, capture_output=True, text=True)
    assert broken.returncode != 0
    assert "ddptui.contract.state.epochs -> ddptui.dashboard.view.app" in broken.stdout
    assert "ddptui.run.owned -> ddptui.dashboard.background" in broken.stdout


def test_every_package_folder_is_installed():
    """pyproject lists the packages (trainer/ installs under another name): a folder missing from
    the list would be missing from a plain `pip install .` and from nothing in an editable one."""
    listed = set(tomllib.load(open(os.path.join(ROOT, "pyproject.toml"), "rb"))
                 ["tool"]["setuptools"]["packages"])
    found = {folder.replace(os.sep, ".").replace("trainer", "ddptui_trainer", 1)
             if folder.startswith("trainer") else folder.replace(os.sep, ".")
             for top in ("ddptui", "trainer")
             for folder, _, files in os.walk(os.path.join(ROOT, top))
             if "__pycache__" not in folder and any(f.endswith(".py") for f in files)
             for folder in [os.path.relpath(folder, ROOT)]}
    assert listed == found


def test_no_module_over_400_lines_and_no_function_over_60():
    """Small modules with one job each: a module that outgrows 400 lines, or a function 60,
    holds two jobs (the house's rule, #66)."""
    import ast

    too_long = []
    for top in ("ddptui", "trainer"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            for name in (f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                with open(path, encoding="utf-8") as f:
                    source = f.read()
                if source.count("\n") > 400:
                    too_long.append(f"{os.path.relpath(path, ROOT)}: {source.count(chr(10))} lines")
                too_long += [f"{os.path.relpath(path, ROOT)}: {n.name} {n.end_lineno - n.lineno + 1}"
                             for n in ast.walk(ast.parse(source))
                             if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                             and n.end_lineno - n.lineno + 1 > 60]
    assert not too_long
