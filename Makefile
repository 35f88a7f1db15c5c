# Two entry points for a fresh machine: `make run` (install + a real run on the built-in data)
# and `make test` (install + the test suite). Both create .venv on first use.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test install lint clean

$(STAMP): pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/ddptui run resnet18 || test $$? -eq 130  # quitting with q or Ctrl-C is no error

# Three tests at a time on CI's two cores: a test spends about a third of its time waiting on
# ranks that import torch or on a timer; two at a time is slower, four no faster
# (docs/benchmarks.md, the CPU machine).
test: $(STAMP)
	PYTHONHASHSEED=0 $(BIN)/python -m pytest -q -n 3 --dist worksteal

clean:
	rm -rf $(VENV) runs .pytest_cache
