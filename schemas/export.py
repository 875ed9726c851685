"""Export the JSON Schema of every record to schemas/json/ (`make schemas`).

`tests/unit/test_schemas.py` fails when the committed files differ from what the
models produce, so a changed record cannot ship with a stale schema.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from pydantic import TypeAdapter

from schemas import balancer_policy, config, metrics, reply, sessions, shard, stats

OUT = Path(__file__).resolve().parent / "json"

# Values are type forms (models and Annotated unions), which only `Any` can hold.
FAMILIES: dict[str, Any] = {
    "config.commands": config.ConfigCommand,
    "config.events": config.ConfigEvent,
    "reply": reply.Reply,
    "shard.requests": shard.ShardRequest,
    "shard.changelog": shard.ShardEvent,
    "shard.stats": stats.ShardStatistics,
    "sessions": sessions.Session,
    "metrics": metrics.MetricSummary,
    # Not Kafka records: the balancer policy's input and output (`shardlog balancer plan`).
    "balancer.snapshot": balancer_policy.Snapshot,
    "balancer.plan": balancer_policy.Plan,
}


def render() -> dict[str, str]:
    """File name -> JSON text of each topic family's schema."""
    files = {}
    for family, model in FAMILIES.items():
        schema = TypeAdapter(model).json_schema()
        schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", "title": family, **schema}
        files[f"{family}.schema.json"] = json.dumps(schema, indent=2, sort_keys=True) + "\n"
    return files


def main() -> None:
    OUT.mkdir(exist_ok=True)
    files = render()
    for stale in set(p.name for p in OUT.glob("*.schema.json")) - set(files):
        (OUT / stale).unlink()
    for name, text in files.items():
        (OUT / name).write_text(text)
    print(f"wrote {len(files)} schemas to {OUT}", file=sys.stderr)


if __name__ == "__main__":
    main()
