"""Removing a shard, past its chunks (which the policy drains): the databases whose
primary it is move to another shard, then the removal completes.  Pure: the catalog
in, actions out (the round loop records and sends them)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from domain.catalog import Catalog
from domain.shardkey import to_ejson
from schemas import balancer as b


def drain_actions(
    catalog: Catalog, busy: set[str], new_id: Callable[[], str]
) -> list[b.MovePrimaryAction | b.RemoveShardAction]:
    """For each draining shard: move one database's primary off it at a time once it
    has no chunk left (a shard runs one migration at a time), then complete the removal."""
    actions: list[b.MovePrimaryAction | b.RemoveShardAction] = []
    for shard in sorted(s.id for s in catalog.shards.values() if s.draining):
        if catalog.chunk_count(shard):
            continue  # the policy is still moving its chunks
        dbs = catalog.primary_of(shard)
        if not dbs:
            actions.append(b.RemoveShardAction(id=new_id(), ns="", shard=shard))
            continue
        if shard in busy or catalog.migration_of(shard) is not None:
            continue
        to = new_primary(catalog, exclude=busy | {shard})
        if to is not None:
            actions.append(b.MovePrimaryAction(id=new_id(), ns=dbs[0], donor=shard, recipient=to))
            busy |= {shard, to}
    return actions


def new_primary(catalog: Catalog, exclude: set[str]) -> str | None:
    """The active shard that is primary of the fewest databases, then holds the fewest chunks."""
    candidates = [s for s in catalog.active_shards() if s not in exclude and catalog.migration_of(s) is None]
    if not candidates:
        return None
    return min(candidates, key=lambda s: (len(catalog.primary_of(s)), catalog.chunk_count(s), s))


def stranded(catalog: Catalog, shard: str) -> list[dict[str, Any]]:
    """`noTarget` blockers: per collection and zone, the zone ranges holding chunks of
    `shard` that no other shard may take (no shard of the zone but `shard`, or only
    draining ones), which the drain waits for forever."""
    out = []
    for ns, coll in sorted(catalog.collections.items()):
        mine = [ch for ch in coll.chunks if ch.shard == shard]
        if not mine:
            continue
        ranges: dict[str, list[dict[str, Any]]] = {}
        for z in coll.zones:
            if catalog.zone_targets(z.zone, exclude=shard):
                continue
            if any(ch.min_key < z.max_key and z.min_key < ch.max_key for ch in mine):
                ranges.setdefault(z.zone, []).append({"min": to_ejson(z.min), "max": to_ejson(z.max)})
        for zone, rs in sorted(ranges.items()):
            shown = ", ".join(f"[{json.dumps(r['min'])}, {json.dumps(r['max'])})" for r in rs)
            out.append(
                {
                    "reason": "noTarget",
                    "ns": ns,
                    "shard": shard,
                    "zone": zone,
                    "ranges": rs,
                    "detail": f"no other shard of zone {zone!r} can take its chunks in {ns} {shown}: "
                    f"add a shard to the zone (shardlog zone add-shard SHARD {zone}) or remove those ranges",
                }
            )
    return out


def removal_status(catalog: Catalog, shard: str, sizes: dict[str, int] | None = None) -> dict[str, Any]:
    """What remains on a draining shard and what blocks it (for `remove-shard --status`)."""
    s = catalog.shards[shard]
    chunks = [(ns, ch) for ns, coll in catalog.collections.items() for ch in coll.chunks if ch.shard == shard]
    blockers = []
    for ns, ch in chunks:
        if ch.jumbo:
            blockers.append(
                {
                    "reason": "jumbo",
                    "ns": ns,
                    "detail": "a jumbo chunk; draining moves it anyway (forceJumbo), which may take long",
                }
            )
        coll = catalog.collections[ns]
        if not coll.settings.allowMigrations:
            blockers.append(
                {
                    "reason": "migrationsDisallowed",
                    "ns": ns,
                    "detail": f"set-allow-migrations {ns} true to let its chunks leave",
                }
            )
        if not coll.settings.balancerEnabled:
            blockers.append(
                {
                    "reason": "balancerDisabled",
                    "ns": ns,
                    "detail": f"balancing is disabled for {ns}; draining needs the balancer",
                }
            )
    if not catalog.settings.balancerEnabled:
        blockers.append({"reason": "balancerStopped", "detail": "the balancer is stopped (shardlog balancer start)"})
    if not [x for x in catalog.active_shards() if x != shard]:
        blockers.append({"reason": "noTarget", "detail": "no other active shard can take the data"})
    blockers += stranded(catalog, shard)
    uniq = {(b["reason"], b.get("ns"), b.get("zone")): b for b in blockers}
    return {
        "shard": shard,
        "draining": s.draining,
        "chunks": len(chunks),
        "dataBytes": (sizes or {}).get(shard),
        "databases": catalog.primary_of(shard),
        "blockers": list(uniq.values()),
    }
