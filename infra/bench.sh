#!/usr/bin/env bash
# `make bench`: every benchmark in bench/ against a throwaway broker (or $KAFKA_BOOTSTRAP's).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ -z "${KAFKA_BOOTSTRAP:-}" ]; then
  dir=$(mktemp -d "${TMPDIR:-/tmp}/shardlog-bench-kafka.XXXXXX")
  trap '$PY infra/kafka/local.py stop --dir "$dir" >/dev/null; rm -rf "$dir"' EXIT
  $PY infra/kafka/local.py start --dir "$dir"
  export KAFKA_BOOTSTRAP=$(cat "$dir/bootstrap")
fi
for b in bench/bench_*.py; do echo "== $b"; $PY "$b"; done
