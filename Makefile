# Two entry points on a fresh machine: `make demo` and `make test`. Both create .venv and install into it.
PYTHON ?= python3.11
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# Debian packages the integration tests start as real peers.
DEBIAN_PEERS := prometheus prometheus-node-exporter prometheus-alertmanager slurmctld slurmd slurm-client chromium lldpd libvirt-clients iperf3 iputils-ping systemd
TORCH := torch==2.13.0

.PHONY: demo test chaos venv install install-test debian-peers lint bench screenshot eval eval-ci clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e '.[all,test]'
	touch $@

$(VENV)/.torch: $(VENV)/.installed
	$(PIP) install --quiet $(TORCH)
	touch $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed $(VENV)/.torch debian-peers

# Installs the Debian peers when missing. As root (CI) a failed install fails the build; without root
# the tests that need a peer skip and say which binary is missing.
debian-peers:
	@missing=""; for p in $(DEBIAN_PEERS); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing; \
	  else echo "warning: not root, cannot install$$missing; the tests that need them will skip"; fi; \
	fi

# Two pytest workers: most tests wait on real peers, not the CPU. Tests that assert wall-clock
# intervals run alone after, away from the other worker's load.
test: install-test
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/pytest -q -n 2 -m "not timing and not chaos"
	$(VENV)/bin/pytest -q -m "timing and not chaos"

# The long attack and crash tests (docs/security.md): query floods, repeated kill -9 of a hub.
chaos: install-test
	$(VENV)/bin/pytest -q -m chaos

# The README's screenshot (docs/fleet.png): the demo's Fleet page, as its end-to-end test sees it.
screenshot: install-test $(VENV)/.torch
	FLEETLENS_SCREENSHOT=$(CURDIR)/docs/fleet.png $(VENV)/bin/pytest -q tests/fleetlens/test_demo.py -k ctrl_c

lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# The whole platform on this machine (fleetlens demo); DEMO_FLAGS="--duration 300 --headless" for a scored run.
demo: $(VENV)/.torch
	$(VENV)/bin/fleetlens demo $(DEMO_FLAGS)

bench: install-test
	$(PY) bench/exporter.py
	$(PY) bench/gpu_scrape.py
	$(PY) bench/steps.py
	$(PY) bench/parser.py
	$(PY) bench/storage_layout.py
	$(PY) bench/ingest.py --nodes 192 --seconds 120 --warmup-s 190
	$(PY) bench/remote_write.py --nodes 96 --warmup 45
	$(PY) bench/promql_range.py
	$(PY) bench/ingest.py --nodes 600 --interval-s 10 --shards 2 --seconds 120 --warmup-s 190
	$(PY) bench/rollup.py
	$(PY) bench/detect.py --nodes 192 --minutes 3
	$(PY) bench/localize.py
	$(PY) bench/active_nodes.py --nodes 2000 --series 100
	$(PY) bench/steptape.py
	$(PY) bench/ui.py
	$(PY) bench/query_vs_ingest.py
	$(PY) bench/hostile_targets.py
	$(PY) bench/escape_corpus.py
	$(PY) bench/install_size.py

# The detection evaluation: the CI subset (also run by `make test`) and the whole scenario suite.
eval-ci: install
	$(VENV)/bin/fleetlens --log-level ERROR eval tests/scenarios/ci-*.yaml --json eval-ci.json

eval: install
	$(VENV)/bin/fleetlens --log-level ERROR eval tests/scenarios/*.yaml tests/scenarios/topology/*.yaml tests/scenarios/lifecycle/*.yaml --json eval.json

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
