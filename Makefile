# Two entry points a fresh machine needs: `make run` and `make test`.
# Each creates or refreshes the virtualenv in .venv as needed.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUN_ARGS ?=

.PHONY: run test venv browser bench clean

venv: $(STAMP)

# torch==2.13.0 is installed by exact version first: it is the CPU wheel that
# lies on this machine's disk; a looser request could pull a multi-GB CUDA build.
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[runtime,test,cluster]'
	@touch $(STAMP)

run: $(STAMP)
	$(BIN)/dsprof run $(RUN_ARGS)

# Headless chromium for the browser tests of the HTML report.
browser:
	@bash scripts/ensure-chromium.sh

test: $(STAMP) browser
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	@for script in benchmarks/bench_*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
