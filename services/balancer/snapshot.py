"""The balancer's snapshot (the input of `policy.plan`) built from the catalog, pure: no I/O.

Chunk data sizes come from the shards' statistics and capacity weights from the
operator; both are passed in, so this only reshapes what the caller already holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from domain.catalog import Catalog
from domain.shardkey import to_ejson


def build(
    catalog: Catalog,
    sizes: Mapping[tuple[str, bytes], int] | None = None,
    weights: Mapping[str, float] | None = None,
    busy: Iterable[str] = (),
) -> dict:
    """The snapshot dict (schemas/json/balancer.snapshot.schema.json) of `catalog`.

    sizes:   (ns, chunk min_key) -> sizeBytes; a chunk missing is 0 bytes.
    weights: shard -> capacity weight; a shard missing weighs 1 (MongoDB's behaviour).
    busy:    shards not available this round, besides those in an active migration
             (a shard takes part in one migration at a time, as in MongoDB).
    """
    sizes, weights, busy = sizes or {}, weights or {}, set(busy)
    shards = [
        {
            "id": s.id,
            "draining": s.draining,
            "zones": sorted(s.zones),
            "available": s.id not in busy and catalog.migration_of(s.id) is None,
            "weight": weights.get(s.id, 1),
        }
        for s in sorted(catalog.shards.values(), key=lambda s: s.id)
    ]
    collections = []
    for ns in sorted(catalog.collections):
        coll = catalog.collections[ns]
        doc = {
            "ns": ns,
            "key": coll.pattern.spec,
            "balancerEnabled": coll.settings.balancerEnabled,
            "allowMigrations": coll.settings.allowMigrations,
            "chunks": [
                {
                    "min": to_ejson(c.min),
                    "max": to_ejson(c.max),
                    "shard": c.shard,
                    "sizeBytes": sizes.get((ns, c.min_key), 0),
                    "jumbo": c.jumbo,
                }
                for c in coll.chunks
            ],
            "zones": [{"zone": z.zone, "min": to_ejson(z.min), "max": to_ejson(z.max)} for z in coll.zones],
        }
        if coll.settings.maxChunkSizeBytes is not None:
            doc["maxChunkSizeBytes"] = coll.settings.maxChunkSizeBytes
        collections.append(doc)
    return {
        "settings": {"maxChunkSizeBytes": catalog.settings.maxChunkSizeBytes},
        "shards": shards,
        "collections": collections,
    }
