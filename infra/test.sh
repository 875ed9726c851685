#!/usr/bin/env bash
# `make test`: start a throwaway broker unless KAFKA_BOOTSTRAP names one, run pytest, stop it.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ -z "${KAFKA_BOOTSTRAP:-}" ]; then
  dir=$(mktemp -d "${TMPDIR:-/tmp}/shardlog-test-kafka.XXXXXX")
  trap '$PY infra/kafka/local.py stop --dir "$dir" >/dev/null; rm -rf "$dir"' EXIT
  $PY infra/kafka/local.py start --dir "$dir"
  export KAFKA_BOOTSTRAP=$(cat "$dir/bootstrap")
fi
echo "make test: broker at $KAFKA_BOOTSTRAP"
$PY -m pytest -q -ra "$@"
