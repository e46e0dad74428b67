# The two commands of the README's quick start:
#   make demo    run a bundled broken training run under driftwatch: live view, then findings
#   make check   install everything and run lint, type checks and the whole test suite
# Both set up .venv themselves on a fresh machine (Python 3.11; root for Debian packages).

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: demo check lint test system-deps bench-deps clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[tf,gpu,dev]'
	touch $@

# Debian's prometheus package brings promtool and the server the integration tests use,
# prometheus-alertmanager the Alertmanager and amtool they deliver alerts through (its
# service, which a systemd host starts on install, is stopped and disabled again: the tests
# run their own); chromium renders the HTML report in its test.
system-deps:
	@command -v promtool >/dev/null && command -v prometheus >/dev/null && \
	  command -v prometheus-alertmanager >/dev/null && command -v chromium >/dev/null || { \
	  apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    prometheus prometheus-alertmanager chromium >/dev/null && \
	  { systemctl disable --now prometheus-alertmanager >/dev/null 2>&1 || true; }; }

# What bench/process_exporter.py compares the daemon with: Debian's process-exporter (not
# needed by make check). The package's service, which a systemd host starts on install,
# is stopped and disabled again: the benchmark runs its own.
bench-deps: $(VENV)/.installed
	@command -v prometheus-process-exporter >/dev/null || { \
	  apt-get update -qq && \
	  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
	    prometheus-process-exporter >/dev/null && \
	  { systemctl disable --now prometheus-process-exporter >/dev/null 2>&1 || true; }; }

demo: $(VENV)/.installed
	$(BIN)/driftwatch demo

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The tests without TensorFlow run four at once: they mostly wait on the processes they
# start (2.5 min on 4 workers against 5 on 2, side by side at the same load). Tests marked
# tf train real models, after the rest. Those judged on step times run one at a time, so no
# other test competes with them for the two cores (as does the one that runs nine jobs at
# once, which takes both); those judged on memory, descriptors,
# threads, disk, event files, NaNs or input-wait shares only, or on nothing timed (marked
# paired), run two at once.
test: $(VENV)/.installed system-deps
	$(BIN)/pytest -n 4 -m "not tf" $(PYTEST_ARGS)
	$(BIN)/pytest -n 2 -m "tf and paired" --durations=10 $(PYTEST_ARGS)
	$(BIN)/pytest -m "tf and not paired" --durations=10 $(PYTEST_ARGS)

# The virtual environment and the Debian packages are set up at once (pip's downloads and
# apt's are independent), then lint and the tests run.
check:
	$(MAKE) -j2 $(VENV)/.installed system-deps
	$(MAKE) lint test

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
