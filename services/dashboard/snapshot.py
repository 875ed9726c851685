"""The cluster picture the page shows, assembled from what the dashboard gathered: a pure function.

Inputs (all as the dashboard last saw them; any may be missing or an error):
- the catalog (the dashboard's follower of config.events): shards, chunks, zones, migrations;
- every shard's last statistics report (shard.stats): data size and documents;
- every shard's ListMigrations answer, or why there is none: the donors' live progress and the
  range-deletion tasks;
- the balancer's GetBalancerState answer, or why there is none, and the rounds seen so far;
- the figures block (services/dashboard/figures.py, when present).

A part that is missing shows as "unknown" (None) with the reason in `errors`, never as a failure
of the whole picture: a slow shard must not blank the page.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from domain import sharding_commands as sc
from domain.catalog import Catalog, Collection, Migration
from domain.shardkey import from_ejson, shell_form, to_ejson
from schemas import stats
from services.range_deleter import deleter

Doc = dict[str, Any]
Answer = Doc | str  # a service's answer, or why there is none
ROUNDS_KEPT = 10  # the balancer rounds the page lists, newest first

# The donor's phases once every document of the range is on the recipient (services/shard/donor.py).
CLONED_PHASES = ("catching up", "critical section", "committing", "done")


@dataclass(frozen=True)
class Links:
    """Searches in the tracing UI (Zipkin's own query parameters: serviceName, annotationQuery)."""

    base: str  # e.g. http://127.0.0.1:9411/zipkin

    def search(self, **params: str) -> str:
        return f"{self.base.rstrip('/')}/?{urlencode(params)}"

    def service(self, name: str) -> str:
        return self.search(serviceName=f"shardlog-{name}")

    def tag(self, key: str, value: str) -> str:
        return self.search(annotationQuery=f"{key}={value}")


def assemble(
    *,
    cluster: str,
    catalog: Catalog,
    reports: Mapping[str, stats.ShardStatistics],
    shards: Mapping[str, Answer],
    balancer: Answer,
    rounds: Sequence[Doc],
    figures: Doc,
    links: Links,
    now: float,
    errors: Mapping[str, str] | None = None,
) -> Doc:
    """The snapshot as /api/snapshot serves it (see docs/reference/observability.md)."""
    errs = dict(errors or {})
    for sid, answer in sorted(shards.items()):
        if isinstance(answer, str):
            errs[f"shard {sid}"] = answer
    if isinstance(balancer, str):
        errs["balancer"] = balancer
    return {
        "cluster": cluster,
        "at": now,
        "configTime": catalog.config_time,
        "shards": [_shard(catalog, sid, reports.get(sid), shards.get(sid), links) for sid in sorted(catalog.shards)],
        "collections": [_collection(catalog.collections[ns], reports, links) for ns in sorted(catalog.collections)],
        "migrations": [
            _migration(catalog, m, shards.get(m.donor), reports.get(m.donor), links)
            for m in sorted(catalog.migrations.values(), key=lambda m: m.id)
        ],
        "balancer": _balancer(catalog, balancer, rounds, links),
        "rangeDeletions": _range_deletions(catalog, shards, now),
        "figures": figures,
        "tracing": links.base,
        "errors": errs,
    }


# ------------------------------------------------------------------ shards


def _shard(
    catalog: Catalog, sid: str, report: stats.ShardStatistics | None, answer: Answer | None, links: Links
) -> Doc:
    s = catalog.shards[sid]
    out: Doc = {
        "id": sid,
        "draining": s.draining,
        "zones": sorted(s.zones),
        "chunks": catalog.chunk_count(sid),
        "dataSizeBytes": None,  # unknown until the shard reports
        "documents": None,
        "reportedAt": None,
        "answering": isinstance(answer, dict),
        "traces": links.service(f"shard-{sid}"),
    }
    if report is not None:
        out.update(
            dataSizeBytes=sum(c.dataSizeBytes for c in report.collections),
            documents=sum(c.documents for c in report.collections),
            reportedAt=report.timestamp,
        )
    return out


# ------------------------------------------------------------------ collections


def _bound_id(bound: Any) -> str:
    """One spelling of a bound, whatever form it came in (in-memory or Extended JSON)."""
    return json.dumps(to_ejson(from_ejson(bound)))


def _collection(coll: Collection, reports: Mapping[str, stats.ShardStatistics], links: Links) -> Doc:
    # A chunk's documents as the newest report describing exactly its range says (any shard's).
    sized: dict[tuple[str, str], tuple[float, int, int]] = {}
    for r in reports.values():
        epochs = {c.ns: c.epoch for c in r.collections}
        if epochs.get(coll.ns, coll.epoch) != coll.epoch:
            continue
        for cs in r.chunks:
            if cs.ns == coll.ns:
                k = (_bound_id(cs.min), _bound_id(cs.max))
                if k not in sized or sized[k][0] < r.timestamp:
                    sized[k] = (r.timestamp, cs.documents, cs.dataSizeBytes)
    chunks = []
    for ch in coll.chunks:
        size = sized.get((_bound_id(ch.min), _bound_id(ch.max)))
        zone = next((z.zone for z in coll.zones if z.min_key <= ch.min_key and ch.max_key <= z.max_key), None)
        chunks.append(
            {
                "min": shell_form(ch.min),
                "max": shell_form(ch.max),
                "shard": ch.shard,
                "jumbo": ch.jumbo,
                "zone": zone,
                "documents": size[1] if size else None,
                "dataSizeBytes": size[2] if size else None,
                # newest first, as config.chunks shows it: the page colours the strip at a past time
                "history": [{"validAfter": _cluster_time(t), "shard": s} for t, s in coll.chunk_history(ch)],
            }
        )
    zones = []
    for z in coll.zones:
        covered = [i for i, ch in enumerate(coll.chunks) if ch.min_key < z.max_key and z.min_key < ch.max_key]
        zones.append(
            {
                "zone": z.zone,
                "min": shell_form(z.min),
                "max": shell_form(z.max),
                "chunks": [covered[0], covered[-1]] if covered else None,  # first and last chunk it touches
            }
        )
    return {
        "ns": coll.ns,
        "key": coll.pattern.spec,
        "keyShell": shell_form(coll.pattern.spec),  # as sh.status() writes it: { k: 1 }
        "chunks": chunks,
        "zones": zones,
        "chunksPerShard": coll.chunks_per_shard(),
        "historyFrom": _cluster_time(coll.history_from),  # the placement before it is not known
        "balancerEnabled": coll.settings.balancerEnabled,
        "allowMigrations": coll.settings.allowMigrations,
        "traces": links.tag("db.namespace", coll.ns),
    }


def _cluster_time(ts: int) -> list[int]:
    """A ClusterTime as [seconds, increment]: JSON numbers lose the low bits of the packed form."""
    return [ts >> 32, ts & 0xFFFFFFFF]


# ------------------------------------------------------------------ migrations


def _migration(
    catalog: Catalog, m: Migration, answer: Answer | None, report: stats.ShardStatistics | None, links: Links
) -> Doc:
    progress = answer.get("progress", {}).get(m.id) if isinstance(answer, dict) else None
    p = progress or {}
    lo, hi = p.get("min", m.min), p.get("max", m.max)  # the donor's range is the exact one
    out: Doc = {
        "id": m.id,
        "kind": m.kind,
        "ns": m.ns,
        "min": shell_form(from_ejson(lo)) if lo is not None else None,
        "max": shell_form(from_ejson(hi)) if hi is not None else None,
        "donor": m.donor,
        "recipient": m.recipient,
        # "unknown": the donor did not answer; "starting": it has not begun this migration yet
        "phase": p.get("phase", "starting") if isinstance(answer, dict) else "unknown",
        "documentsCloned": p.get("cloned"),
        "bytesCloned": p.get("bytes"),
        "mods": p.get("mods"),
        "startedAt": p.get("started"),
        "documentsInRange": None,
        "fraction": None,
        "traces": links.tag("shardlog.migration", m.id),
    }
    coll = catalog.collections.get(m.ns)
    if m.kind == "range" and coll is not None and report is not None and lo is not None:
        out["documentsInRange"] = _documents_in(coll, report, lo, hi)
    if out["phase"] in CLONED_PHASES:
        out["fraction"] = 1.0
    elif out["documentsInRange"] and out["documentsCloned"] is not None:
        out["fraction"] = min(1.0, out["documentsCloned"] / out["documentsInRange"])
    elif out["documentsInRange"] == 0 and out["phase"] == "cloning":
        out["fraction"] = 1.0
    return out


def _documents_in(coll: Collection, report: stats.ShardStatistics, lo: Any, hi: Any) -> int | None:
    """The documents of the donor's last report in [lo, hi) (hi None: the chunk at lo)."""
    try:
        lo_key = coll.pattern.encode_bound(from_ejson(lo))
        hi_key = coll.pattern.encode_bound(from_ejson(hi)) if hi is not None else None
    except ValueError:
        return None
    total, seen = 0, False
    for ch in report.chunks:
        if ch.ns != coll.ns:
            continue
        try:
            c_lo, c_hi = coll.pattern.encode_bound(from_ejson(ch.min)), coll.pattern.encode_bound(from_ejson(ch.max))
        except ValueError:
            continue
        if c_lo < lo_key or (hi_key is not None and c_hi > hi_key) or (hi_key is None and c_lo != lo_key):
            continue
        total, seen = total + ch.documents, True
    return total if seen else None


# ------------------------------------------------------------------ balancer


def _balancer(catalog: Catalog, answer: Answer, rounds: Sequence[Doc], links: Links) -> Doc:
    out: Doc = {
        "enabled": catalog.settings.balancerEnabled,  # the catalog's setting, known even if the balancer is down
        "mode": sc.balancer_mode(catalog),
        "window": catalog.settings.balancerWindow.model_dump() if catalog.settings.balancerWindow else None,
        "answering": isinstance(answer, dict),
        "inWindow": None,
        "round": None,
        "activity": None,
        "inFlight": [],
        "notCompliant": {},
        "recentFailures": [],
        "rounds": list(rounds)[:ROUNDS_KEPT],
        "traces": links.service("balancer"),
    }
    if isinstance(answer, dict):
        out.update(
            inWindow=answer.get("inWindow"),
            round=answer.get("round"),
            activity=answer.get("activity"),
            inFlight=answer.get("inFlight", []),
            notCompliant=answer.get("notCompliant", {}),
            recentFailures=answer.get("recentFailures", [])[-5:],
            inBalancerRound=sc.balancer_status_reply(catalog, answer)["inBalancerRound"],
        )
    return out


def remember_round(rounds: list[Doc], answer: Answer) -> list[Doc]:
    """The rounds seen so far, newest first, with the balancer's last one added if it is new
    (the balancer keeps only its last round; the dashboard remembers the ones it saw)."""
    last = answer.get("lastRound") if isinstance(answer, dict) else None
    if not last or not last.get("round") or any(r.get("round") == last["round"] for r in rounds):
        return rounds
    return [last, *rounds][:ROUNDS_KEPT]


# ------------------------------------------------------------------ range deletions


def _range_deletions(catalog: Catalog, shards: Mapping[str, Answer], now: float) -> Doc:
    """Every shard's tasks with why each waits: the range deleter's own policy on them."""
    tasks = [t for a in shards.values() if isinstance(a, dict) for t in a.get("rangeDeletions", [])]
    plan = deleter.plan(tasks, catalog.settings, now)
    rows = [
        {
            "shard": t["shard"],
            "id": t["id"],
            "ns": t["ns"],
            "min": shell_form(from_ejson(t["min"])),
            "max": shell_form(from_ejson(t["max"])),
            "state": deleter.state(t),
            "left": t.get("left"),
            "deleted": t.get("deleted"),
            "waiting": plan.waiting[deleter.key(t)],
        }
        for t in sorted(tasks, key=lambda t: (t["shard"], t.get("readyAt") or 0.0, t["id"]))
    ]
    return {"tasks": rows, "unanswered": sorted(sid for sid, a in shards.items() if not isinstance(a, dict))}


def empty_figures() -> Doc:
    """The figures block when no Figures runs (yet): the contract's shape, nothing measured."""
    return {"windowS": 60, "at": time.time(), "shards": {}, "collections": {}, "routers": {}, "dropped": {"spans": 0}}
