# Two entry points a fresh machine needs: `make run` and `make test`.
# Each creates or refreshes the virtualenv in .venv as needed.
# `make check` is the developer's quick tier (CONTRIBUTING.md).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
RUN_ARGS ?=
# pytest-xdist workers; tests marked runtime or cluster run last and alone (tests/conftest.py)
TEST_WORKERS ?= auto
# The tests that need no rank processes, browser, Ray cluster or large files (markers: pyproject.toml)
QUICK_TESTS := not runtime and not browser and not cluster and not slow
# the product's packages, for the dead-code check (vulture)
PRODUCT := analysis cli dsprof profiler runtime
# mypy's cache outlives scripts/typecheck.py's temporary tree; it goes with the virtualenv
MYPY_CACHE := $(abspath $(VENV))/mypy-cache

.PHONY: run test check check-lint check-types check-tests venv browser bench clean

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

# The full suite, as CI runs it; pytest's summary line is the last line printed.
test: $(STAMP) browser
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadscope --no-loadscope-reorder

# Lint, format, types and the quick tests, in under a minute: mypy runs beside the tests,
# each part's output printed whole when it ends; any failure fails the check.
check: $(STAMP)
	@$(MAKE) --no-print-directory -j 3 --output-sync=target check-lint check-types check-tests

check-lint:
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/vulture --min-confidence 80 $(PRODUCT)

check-types:
	MYPY_CACHE_DIR=$(MYPY_CACHE) $(BIN)/python scripts/typecheck.py

check-tests:
	$(BIN)/python -m pytest -q -n $(TEST_WORKERS) -m "$(QUICK_TESTS)"

bench: $(STAMP)
	@for script in benchmarks/bench_*.py; do echo "== $$script"; $(BIN)/python $$script || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
