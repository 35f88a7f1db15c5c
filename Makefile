# Two entry points for a fresh machine: `make run` (install + a real run on the built-in data)
# and `make test` (install + the test suite). Both create .venv on first use; `make run`
# installs only what running needs, `make test` adds the test extras.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
SOURCES := $(shell find ddptui trainer -name '*.py' -o -name '*.tcss')

.PHONY: run test install clean

# make run: a plain install (an editable one prints setuptools' warning block at each install),
# made again when a source changes; where make test made the editable one, that one is kept.
$(VENV)/.run-installed: pyproject.toml $(SOURCES)
	test -d $(VENV) || $(PY) -m venv $(VENV)
	test -f $(VENV)/.test-installed || { $(BIN)/pip install -q --upgrade pip && \
		$(BIN)/pip install -q . ; }
	touch $@

$(VENV)/.test-installed: pyproject.toml
	test -d $(VENV) || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[test]'
	touch $@ $(VENV)/.run-installed

install: $(VENV)/.run-installed

run: $(VENV)/.run-installed
	$(BIN)/ddptui run resnet18 || test $$? -eq 130  # quitting with q or Ctrl-C is no error

# Three tests at a time on CI's two cores: a test spends about a third of its time waiting on
# ranks that import torch or on a timer; two at a time is slower, four no faster
# (docs/benchmarks.md, the suite and the CPU machine).
test: $(VENV)/.test-installed
	$(BIN)/lint-imports --no-cache  # the layers: pyproject's [tool.importlinter]
	$(BIN)/vulture  # dead code: pyproject's [tool.vulture]
	$(BIN)/ruff check -q ddptui trainer tests bench examples  # style: pyproject's [tool.ruff]
	$(BIN)/mypy  # types of the floor and the command line: pyproject's [tool.mypy]
	# Bytecode once, not in each of the suite's ~400 processes: where PYTHONDONTWRITEBYTECODE is set
	# an editable install's modules are otherwise compiled anew by every one.
	$(BIN)/python -m compileall -q ddptui trainer examples tests > /dev/null
	PYTHONHASHSEED=0 $(BIN)/python -m pytest -q -n 3 --dist worksteal

clean:
	rm -rf $(VENV) runs .pytest_cache
