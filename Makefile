# tidelog: `make demo` runs the main job, `make test` the whole suite. Both set up .venv themselves.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-stamp

.PHONY: demo test system-deps lint bench bench-append bench-produce bench-read bench-recovery clean

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[test,bench,spark]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/tidelog demo

# Debian packages the tests use with real clients (kcat). Installed once, as root or through sudo.
system-deps:
	@command -v kcat >/dev/null 2>&1 || { \
	  echo "installing Debian package kcat for the client tests"; \
	  SUDO=$$( [ "$$(id -u)" -eq 0 ] || echo sudo ); \
	  $$SUDO apt-get install -y -q kcat >/dev/null 2>&1 || \
	  { $$SUDO apt-get update -q >/dev/null 2>&1 && $$SUDO apt-get install -y -q kcat >/dev/null; }; }

test: $(STAMP) system-deps
	$(VENV)/bin/ruff check src tests bench
	$(PY) -m pytest -q tests -m "not slow"; status=$$?; \
	if [ $$status -eq 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi; exit $$status

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench
	$(VENV)/bin/ruff format --check src tests bench

bench: bench-append bench-produce bench-read bench-recovery

bench-append: $(STAMP)
	$(PY) bench/append_throughput.py

bench-produce: $(STAMP)
	$(PY) bench/produce_records.py

bench-read: $(STAMP)
	$(PY) bench/random_reads.py

bench-recovery: $(STAMP)
	$(PY) bench/recovery_scan.py

clean:
	rm -rf $(VENV) build src/*.egg-info .pytest_cache .hypothesis tidelog-demo-data
