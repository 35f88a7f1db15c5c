"""The documents tell the truth: the keys are described once (README, docs, help screen,
--help), and the docs link to files that exist."""

from __future__ import annotations

import os
import re

from tests.helpers.runs import ROOT


def test_the_keys_are_described_once_and_the_docs_show_that_description():
    from ddptui.cli import EXAMPLES
    from ddptui.contract.keys import KEYS, key_rows, keys_lines, keys_table
    from ddptui.dashboard.view.app import DashboardApp
    from ddptui.dashboard.view.screens.help import help_text

    bound = {(b.key, b.action, b.description) for b in DashboardApp.BINDINGS}
    assert {(k.keys, k.action, k.label) for k in KEYS} <= bound
    for doc in ("README.md", "docs/dashboard.md"):
        with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
            assert keys_table() in f.read(), f"{doc}: paste ddptui.contract.keys.keys_table() in"
    built_in = key_rows(lambda action: None, lambda key: False)  # every key acts as described
    assert keys_table(built_in) in help_text(built_in)
    assert [does for _, does in built_in] == [k.does for k in KEYS if k.shown]
    assert "\n".join(keys_lines()) in EXAMPLES


def test_the_docs_link_only_to_files_that_exist():
    for doc in ["README.md"] + [f"docs/{f}" for f in os.listdir(os.path.join(ROOT, "docs"))
                                if f.endswith(".md")]:
        with open(os.path.join(ROOT, doc), encoding="utf-8") as f:
            text = f.read()
        for target in re.findall(r"\]\(([^)#]+)", text):
            path = os.path.join(ROOT, os.path.dirname(doc), target.replace("%5B", "[")
                                .replace("%5D", "]"))
            assert os.path.exists(path), f"{doc} links to {target}, which is not there"
