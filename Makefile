# runwatch: every target does its own set-up on a fresh machine (venv, packages, Kafka jars).
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help lock compiled test test-deploy images demo lint typecheck bench kafka-jars tools venv clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/'

EXTRAS := torch,sinks,dev,hf,lightning,rocksdb,ft

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e '.[$(EXTRAS)]'
	$(PY) native_build.py >/dev/null || echo 'make venv: the mypyc build failed, the core runs its pure source (make compiled says why)'
	touch $(STAMP)

venv: $(STAMP)  ## create .venv and install runwatch with every extra at constraints.txt's versions (and `make compiled`)

lock:  ## re-resolve every extra at its newest versions in a scratch venv and write constraints.txt (then run make test)
	rm -rf .lock-venv && $(PYTHON) -m venv .lock-venv
	.lock-venv/bin/python -m pip install -q --upgrade pip
	.lock-venv/bin/python -m pip install -q -e '.[$(EXTRAS),peers]'
	{ sed -n '/^#/p' constraints.txt; .lock-venv/bin/python -m pip freeze --exclude-editable; } > constraints.txt.new
	mv constraints.txt.new constraints.txt && rm -rf .lock-venv

compiled: $(STAMP)  ## compile the core's hot kernels with mypyc, in place (RUNWATCH_PURE_PYTHON=1 runs the pure source)
	$(PY) native_build.py

kafka-jars: $(STAMP)  ## fetch Apache Kafka's jars from Maven Central (once; cached in ~/.runwatch)
	$(PY) -c "from runwatch.broker import ensure_jars; print('kafka jars:', ensure_jars())"

tools:  ## best effort: kcat (wire-format test), chromium + chromedriver (web view browser test), Alertmanager + promtool (alerting tests)
	@command -v kcat >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get update -qq && apt-get install -y -qq kcat) >/dev/null 2>&1; } || \
	  echo "kcat not installed: the kcat wire-format test will be skipped"
	@{ command -v chromium >/dev/null && command -v chromedriver >/dev/null; } || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && (apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium chromium-driver) >/dev/null 2>&1; } || \
	  echo "chromium/chromedriver not installed: the web view browser test will be skipped"
	@{ command -v prometheus-alertmanager >/dev/null && command -v amtool >/dev/null && command -v promtool >/dev/null; } || \
	  { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && (apt-get update -qq && \
	    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus-alertmanager prometheus) >/dev/null 2>&1; } || \
	  echo "prometheus-alertmanager/amtool/promtool not installed: the Alertmanager and promtool tests will be skipped"

# Two pytest-xdist workers, whole files each (module fixtures stay together), each with a
# broker of its own: most integration tests wait on real timeouts, rebalances and rank
# processes, so a second worker fills the idle core (16.8 -> 11.3 min on the 2-core box).
TEST_WORKERS ?= 2

test: $(STAMP) kafka-jars tools  ## run the whole test suite against a real broker (TEST_WORKERS=0: one process)
	$(PY) -m pytest -q --durations=25 $(if $(filter-out 0,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

images: $(STAMP) kafka-jars  ## build the compose images locally from Debian's mirror (runwatch/kafka:local, runwatch:local, runwatch/prometheus:local); cached
	PYTHON=$(PY) compose/images/build.sh

# Docker: best effort, like `tools` (root + apt-get installs docker.io, docker-compose and
# debootstrap; dockerd is started if none answers). Without an engine: one line, exit 0.
# With one, any failure fails: the image builds, the compose test, the testcontainers run.
test-deploy: $(STAMP) kafka-jars  ## the compose stack run for real (3 brokers, 2 processors, sinks, Prometheus) and the session fixture on the locally built Kafka image
	@rc=0; compose/images/engine.sh || rc=$$?; \
	if [ $$rc = 75 ]; then exit 0; elif [ $$rc != 0 ]; then exit $$rc; fi; \
	set -ex; \
	PYTHON=$(PY) compose/images/build.sh; \
	$(PY) -m pytest -q -m deploy tests/integration/deploy; \
	env -u RUNWATCH_BOOTSTRAP RUNWATCH_TEST_BROKER=docker RUNWATCH_TEST_KAFKA_IMAGE=runwatch/kafka:local \
	  $(PY) -m pytest -q tests/integration/processors/test_end_to_end.py

demo: $(STAMP) kafka-jars  ## the whole pipeline on the embedded broker with a real torch run; prints the web view address
	$(VENV)/bin/runwatch demo

lint: $(STAMP)  ## ruff (lint and format) and mypy (strict on schemas/, processors/core/, common/ and controller/)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy -p runwatch.schemas -p runwatch.processors.core -p runwatch.common -p runwatch.controller

bench: $(STAMP) kafka-jars  ## every benchmark in bench/ (prints figures and a JSON line each)
	for b in bench/*.py; do echo "== $$b"; $(PY) $$b || exit 1; done

clean:  ## remove the venv and caches (not ~/.runwatch)
	rm -rf $(VENV) build processors/core/*.so processors/core/native_sources.json .pytest_cache .mypy_cache .ruff_cache .hypothesis
