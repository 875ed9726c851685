#!/usr/bin/env bash
# Run a command with a Kafka broker: the one at $KAFKA_BOOTSTRAP, or a throwaway
# local one (free ports, small heap) that is stopped and removed afterwards.
#   infra/with-kafka.sh .venv/bin/python -m pytest -q
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
if [ -z "${KAFKA_BOOTSTRAP:-}" ]; then
  dir=$(mktemp -d "${TMPDIR:-/tmp}/shardlog-kafka.XXXXXX")
  trap '$PY infra/kafka/local.py reset --dir "$dir" >/dev/null' EXIT
  $PY infra/kafka/local.py start --dir "$dir"
  export KAFKA_BOOTSTRAP=$(cat "$dir/bootstrap")
fi
echo "broker at $KAFKA_BOOTSTRAP"
"$@"
