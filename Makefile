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

test: $(STAMP)
	PYTHONHASHSEED=0 $(BIN)/python -m pytest -q

clean:
	rm -rf $(VENV) runs .pytest_cache
