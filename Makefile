# shardlog — set-up contract: `make up`, `make down`, `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
DATA   ?= .shardlog

.PHONY: venv jars up down test unit schemas bench status

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

# Apache Kafka broker jars from Maven Central, cached under ~/.cache/shardlog.
jars:
	$(PYTHON) infra/kafka/local.py fetch

# Local broker + demo cluster (config, 3 shards, router, balancer, range-deleter).
up: venv jars
	$(PY) -m infra.cluster up --data $(DATA)

down:
	@if [ -x $(PY) ]; then $(PY) -m infra.cluster down --data $(DATA); else $(PYTHON) infra/kafka/local.py stop --dir $(DATA)/kafka; fi

# Whole suite against a real broker: ours on free ports, or $KAFKA_BOOTSTRAP's.
test: venv jars
	PY=$(PY) bash infra/with-kafka.sh $(PY) -m pytest -q -ra $(ARGS)

unit: venv
	$(PY) -m pytest -q -m "not kafka" $(ARGS)

# Re-export JSON Schemas of every record (a test fails when they are stale).
schemas: venv
	$(PY) -m schemas.export

bench: venv jars
	PY=$(PY) bash infra/with-kafka.sh bash -c 'for b in bench/bench_*.py; do echo "== $$b"; $(PY) "$$b" || exit 1; done'
