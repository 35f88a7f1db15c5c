# Two entry points for a fresh machine: `make run` (install + a real run on the built-in data)
# and `make test` (install + the test suite). Both create .venv on first use; `make run`
# installs only what running needs, `make test` adds the test extras.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# compat: a .pth file names the checkout; the default meta path finder prints a warning block
# at every install ("Editable installation ...").
PIP_INSTALL := $(BIN)/pip install -q --config-settings editable_mode=compat -e

.PHONY: run test install clean

$(VENV)/.run-installed: pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(PIP_INSTALL) .
	touch $@

$(VENV)/.test-installed: pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(PIP_INSTALL) '.[test]'
	touch $@ $(VENV)/.run-installed

install: $(VENV)/.run-installed

run: $(VENV)/.run-installed
	$(BIN)/ddptui run resnet18 || test $$? -eq 130  # quitting with q or Ctrl-C is no error

# Three tests at a time on CI's two cores: a test spends about a third of its time waiting on
# ranks that import torch or on a timer; two at a time is slower, four no faster
# (docs/benchmarks.md, the CPU machine).
test: $(VENV)/.test-installed
	PYTHONHASHSEED=0 $(BIN)/python -m pytest -q -n 3 --dist worksteal

clean:
	rm -rf $(VENV) runs .pytest_cache
