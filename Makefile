# shardlog — set-up contract: `make up`, `make down`, `make test`.
PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
DATA   ?= .shardlog

BROKERS ?=

.PHONY: venv jars zipkin chromium mongosh print-mongosh ycsb-java pymongo-tests up down reset clean-data lint format test unit schemas bench status sim sim-long

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(VENV)/bin/pip install -q --upgrade pip
	$(VENV)/bin/pip install -q -e '.[dev]'
	touch $@

# Apache Kafka broker jars from Maven Central, cached under ~/.cache/shardlog.
jars:
	$(PYTHON) infra/kafka/local.py fetch

# Zipkin's server (io.zipkin:zipkin-server:3.6.1, classifier exec) from Maven Central, checked against
# its published SHA-256, into ~/.cache/shardlog like Kafka's jars: the tracing UI `make up` starts.
zipkin:
	$(PYTHON) infra/zipkin/local.py fetch

# mongosh (MongoDB's shell) from the npm registry, pinned with its whole dependency tree by
# infra/mongosh/package-lock.json (`npm ci`), into ~/.cache/shardlog like Kafka's jars: installed
# into a scratch dir and renamed when complete, so a second run (or a run offline afterwards) is
# a no-op.  A new lock (another version) gets a new cache dir.  The wire tests run $(MONGOSH_BIN).
MONGOSH_VERSION ?= 2.12.0
MONGOSH_LOCK    := infra/mongosh/package-lock.json
MONGOSH_DIR     ?= $(HOME)/.cache/shardlog/mongosh-$(MONGOSH_VERSION)-$(shell cksum < $(MONGOSH_LOCK) | cut -d' ' -f1)
MONGOSH_BIN     := $(MONGOSH_DIR)/node_modules/.bin/mongosh
mongosh: $(MONGOSH_DIR)/.complete
$(MONGOSH_DIR)/.complete:
	@command -v npm >/dev/null || { echo "make mongosh: npm (Node.js) is needed" >&2; exit 1; }
	rm -rf $(MONGOSH_DIR).partial && mkdir -p $(MONGOSH_DIR).partial
	cp infra/mongosh/package.json $(MONGOSH_LOCK) $(MONGOSH_DIR).partial/
	cd $(MONGOSH_DIR).partial && npm ci --no-audit --no-fund --loglevel=error
	$(MONGOSH_DIR).partial/node_modules/.bin/mongosh --version
	rm -rf $(MONGOSH_DIR) && mv $(MONGOSH_DIR).partial $(MONGOSH_DIR) && touch $@
print-mongosh:
	@echo $(MONGOSH_BIN)

# Local Kafka (BROKERS=3 for a replicated 3-node KRaft cluster, chosen when $(DATA) is new)
# + demo cluster (config, 3 shards (SHARDS=4 for s0..s3: starts and adds s3), router, balancer, range-deleter).  Starts whatever is not
# running; every service resumes from its checkpoint.  Zipkin (the tracing UI, http://127.0.0.1:9411/zipkin/)
# too, and the services export their spans to it; TRACING=0 leaves it out.
TRACING ?= 1
up: venv jars $(if $(filter 0,$(TRACING)),,zipkin)
	$(PY) -m infra.cluster up --data $(DATA) $(if $(BROKERS),--brokers $(BROKERS)) $(if $(ROUTERS),--routers $(ROUTERS)) $(if $(SHARDS),--shards $(SHARDS)) $(if $(filter 0,$(TRACING)),--no-tracing)

# Stop everything; every document, the catalog and the brokers' logs stay for the next `make up`.
down:
	@if [ -x $(PY) ]; then $(PY) -m infra.cluster down --data $(DATA); else $(PYTHON) infra/kafka/local.py stop --dir $(DATA)/kafka; fi

# Stop everything and delete the data: service stores, logs and the local brokers' logs.
reset:
	@if [ -x $(PY) ]; then $(PY) -m infra.cluster reset --data $(DATA); else $(PYTHON) infra/kafka/local.py reset --dir $(DATA)/kafka; rm -rf $(DATA); fi
clean-data: reset

# What runs: every service and local broker, with pids and ports.
status:
	@$(PY) -m infra.cluster status --data $(DATA)

# ruff (lint and format check), import-linter (which package may import which) and mypy
# (strict, on the files [tool.mypy] lists), all configured in pyproject.toml; `make format` rewrites.
lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/mypy

format: venv
	$(VENV)/bin/ruff check --fix .
	$(VENV)/bin/ruff format .

# Debian's chromium and its chromedriver for the browser tests (headless): installed with apt when
# missing and we may (root, or sudo without a password); otherwise those tests skip and say why.
chromium:
	@if [ -x /usr/bin/chromium ] && [ -x /usr/bin/chromedriver ]; then :; \
	elif command -v apt-get >/dev/null && { [ "$$(id -u)" = 0 ] || sudo -n true 2>/dev/null; }; then \
	  S=$$([ "$$(id -u)" = 0 ] || echo sudo -n); \
	  $$S apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive $$S apt-get install -y -q chromium chromium-driver >/dev/null \
	  || echo "make chromium: apt could not install chromium; the browser tests will skip" >&2; \
	else echo "make chromium: no apt (or no root); the browser tests will skip" >&2; fi

# Whole suite against a real broker: ours on free ports, or $KAFKA_BOOTSTRAP's.
# PYTHONHASHSEED=0: a simulated schedule that fails here repeats under `make sim SEED=n`.
test: venv jars zipkin ycsb-java pymongo-tests chromium
	PYTHONHASHSEED=0 PY=$(PY) bash infra/with-kafka.sh $(PY) -m pytest -q -ra $(ARGS)

# Pure logic, no broker: tests/unit (under a minute).
unit: venv
	$(PY) -m pytest -q tests/unit $(ARGS)

# The whole cluster in one process on the in-memory bus, under seeded schedules of faults
# (tests/sim, docs/reference/simulator.md). `make sim` runs SCHEDULES seeds from FIRST (100 from
# 0) in JOBS worker processes (1), `make sim SEED=n` one (SHRINK=1: its smallest failing plan),
# BUGS="a b" puts known bugs back, ROCKSDB=1 keeps the stores in RocksDB (not the simulated disk).
SCHEDULES ?= 100
FIRST ?= 0
JOBS ?= 1
sim: venv
	PYTHONHASHSEED=0 $(PY) -m tests.sim $(if $(SEED),--seed $(SEED) $(if $(SHRINK),--shrink),--schedules $(SCHEDULES) --first $(FIRST) --jobs $(JOBS)) $(foreach b,$(BUGS),--bug $(b)) $(if $(ROCKSDB),--rocksdb) $(ARGS)

# The nightly-style run: 100,000 schedules, every one even after a failure (hours; not in CI).
sim-long: venv
	PYTHONHASHSEED=0 $(PY) -m tests.sim --schedules 100000 --first $(FIRST) --jobs $(JOBS) --keep-going $(if $(ROCKSDB),--rocksdb) $(ARGS)

# Re-export JSON Schemas of every record (a test fails when they are stale).
schemas: venv
	$(PY) -m schemas.export

bench: venv jars zipkin
	PY=$(PY) bash infra/with-kafka.sh bash -c 'for b in bench/bench_*.py; do echo "== $$b"; $(PY) "$$b" || exit 1; done'

# YCSB's core workload engine (site.ycsb:core 0.17.0) + the MongoDB Java driver from Maven Central,
# with our binding shardlog.ycsb.MongoWireClient (infra/ycsb/) built against them, into
# ~/.cache/shardlog/ycsb-0.17.0-<digest of the pom and sources> like Kafka's jars: a second run (or
# a run offline afterwards) is a no-op.  `python3 infra/ycsb/ycsb.py load|run --url mongodb://...`
# runs site.ycsb.Client on it (see bench/README.md, "YCSB through the Java driver").
ycsb-java:
	$(PYTHON) infra/ycsb/ycsb.py fetch

# The drivers' transactions specification tests (unified format) and pymongo's own runner, from
# pymongo's source distribution on PyPI (pip, the installed pymongo's version, its SHA-256 pinned
# in the script), into ~/.cache/shardlog/pymongo-<version>-tests like the other fetchers:
# tests/integration/test_transactions_spec.py runs them against a cluster.
pymongo-tests: venv
	$(PY) infra/drivers/pymongo_tests.py fetch
