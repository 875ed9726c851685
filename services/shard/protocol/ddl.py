"""The shard's side of a DDL coordinator (docs/reference/ddl.md, decision 0018): what a shard
does when the config server's coordinator asks, each step decided here and recorded in the
changelog with its reply, in one transaction.

    request                      expects                       leaves
    EnterDDLCriticalSection      (no section `id`)             section `id`: CRUD on its namespaces refused
                                 (section `id` recorded)       as it was (a retry)
    ExitDDLCriticalSection       (section `id` recorded)       (no section `id`): CRUD served again; the
                                                               drops of `id` forgotten
                                 (no section `id`)             as it was (a retry)
    DropLocalData                (`ns`/`db` not dropped by     every document of `ns` (every collection of
                                 `id` yet)                     `db`) gone, as one range deletion; their
                                                               range-deletion tasks and secondary
                                                               indexes (entries, states) removed
                                 (dropped by `id` already)     as it was (a retry: what a later
                                                               RenameLocalBatch moved in stays)
    RenameLocalBatch             (`ns` renamed to `to` in      up to `limit` documents of `ns` gone: the
                                 the catalog)                  ones this shard owns under `to` written
                                                               there, orphans only removed; the
                                                               range-deletion tasks of `ns` removed
                                 (`ns` empty here)             as it was: done
                                 (the first batch)             the ready indexes of `ns` moved to `to`
    RekeyLocalBatch              (`ns` sharded: its current,   up to `limit` documents of `ns` after
                                 refined key)                  `after` examined: rewritten under the
                                                               refined key, or removed if not owned
                                                               here; the range-deletion tasks removed
                                 (none left after `after`)     as it was: done

Refusals (nothing recorded): EnterDDLCriticalSection naming no namespace and no database, or
again for `id` with other namespaces, and DropLocalData naming neither or both of `ns` and
`db` (BadValue); RenameLocalBatch while the catalog still has `ns` (StaleConfig: it has not
caught up with the rename); RekeyLocalBatch of a collection that is not sharded
(NamespaceNotSharded).  And a late request: an enter, drop, rename or rekey batch of a DDL
that the shard's catalog shows finished, rolling back, or past the phase that sends it
(IllegalOperation): a config server deposed while cut off delivers what its producer held once
the partition heals, and the coordinator that took over has left the section already.

A batch retried goes on where the shard stands (what it moved or rewrote is not found
again), so the coordinator repeats a batch request until `done`, after a restart too.

While a section covers a namespace (listed, or any collection of its database), every
CRUD request on it is refused with the retriable StaleConfig of a migration's critical
section: the router waits for the next ConfigTime and retries.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

from domain.ddl import Phase, order_of
from domain.protocol import ErrorCode
from domain.shardkey import ShardKeyError
from libs.errors import CommandError
from schemas import Record, Tombstone
from schemas import ddl as d
from schemas import indexes as ix
from schemas import shard as s
from services.shard.documents import UNSHARDED_KEY, index_changelog_key, shard_key_part
from services.shard.protocol.common import Doc, Shard, Step, owns


def fault(req: Record) -> str:
    """The fault point a step that records something reaches while it is decided."""
    return f"ddl.shard.{req.type}"


def covers(section: d.DDLCriticalSectionRecorded, ns: str) -> bool:
    return ns in section.namespaces or (section.db is not None and ns.partition(".")[0] == section.db)


def section_holding(shard: Shard, ns: str) -> d.DDLCriticalSectionRecorded | None:
    """The DDL critical section that holds `ns` on this shard, if any."""
    return next((c for c in shard.documents.ddl_sections.values() if covers(c, ns)), None)


def critical_section_wait(shard: Shard, ns: str, section: d.DDLCriticalSectionRecorded) -> CommandError:
    """The refusal of a read or write of a namespace a DDL holds: the same retriable shape as a
    migration's critical section (the router waits for the next ConfigTime and retries)."""
    return CommandError(
        ErrorCode.StaleConfig,
        f"{shard.id}: {ns} is held by the critical section of DDL {section.id}",
        {"shard": shard.id, "configTime": shard.catalog.config_time + 1, "critical": True},
    )


def _in(ns: str, target_ns: str | None, target_db: str | None) -> bool:
    return ns == target_ns if target_ns is not None else ns.partition(".")[0] == target_db


def _task_removals(shard: Shard, ns: str | None = None, db: str | None = None) -> list[Record]:
    return [
        s.RangeDeletionRemoved(id=t.id)
        for t in sorted(shard.documents.range_tasks.values(), key=lambda t: t.id)
        if _in(t.ns, ns, db)
    ]


# ------------------------------------------------------------ late requests

# The coordinator's phase whose work sends each request that changes this shard
# (services/config/coordinator.py `_work`); the exit, sent to release or roll back, is always
# served (a late one finds nothing to leave).
SENT_IN: dict[type, Phase] = {
    d.EnterDDLCriticalSection: Phase.BLOCK_CRUD,
    d.DropLocalData: Phase.APPLY,
    d.RenameLocalBatch: Phase.APPLY,
    d.RekeyLocalBatch: Phase.APPLY,
}


def refuse_if_moved_past(shard: Shard, req: Record) -> None:
    """Refuse a request of a coordinator that our catalog shows finished, rolling back, or past
    the phase that sends it: a late one, sent by a config server deposed since (cut off from the
    bus past its session, its producer delivering what it had buffered once the partition
    healed) or by a retry still running after its phase ended.  Served, a late enter would hold
    its namespaces for ever (no coordinator is left to send the exit), a late drop or rename
    batch would delete or move documents written since.  A coordinator our catalog does not
    show yet (behind the sender's ConfigTime) is decided as before."""
    rid = getattr(req, "id", "")
    if rid in shard.catalog.ddl_outcomes:
        over = "has finished"
    elif (c := shard.catalog.ddl.get(rid)) is None:
        return
    elif c.phase == Phase.ROLLBACK:
        over = "is rolling back"
    else:
        order, sent_in = order_of(c.op), SENT_IN[type(req)]
        if c.phase not in order or sent_in not in order or order.index(c.phase) <= order.index(sent_in):
            return
        over = f"is past {sent_in} (in {c.phase})"
    raise CommandError(
        ErrorCode.IllegalOperation,
        f"{shard.id}: DDL {rid} {over}: its {req.type} comes from a coordinator that no longer runs it",
    )


# ------------------------------------------------------------ the critical section


def enter_critical_section(shard: Shard, req: d.EnterDDLCriticalSection) -> Step:
    if not req.namespaces and req.db is None:
        raise CommandError(ErrorCode.BadValue, f"DDL {req.id}: a critical section needs namespaces or a database")
    refuse_if_moved_past(shard, req)
    held = shard.documents.ddl_sections.get(req.id)
    reply = {"id": req.id, "critical": True}
    if held is not None:
        if sorted(held.namespaces) != sorted(req.namespaces) or held.db != req.db:
            raise CommandError(
                ErrorCode.BadValue,
                f"DDL {req.id} already holds {held.namespaces or held.db} on {shard.id}, not {req.namespaces or req.db}",
            )
        return Step([], reply)
    event = d.DDLCriticalSectionRecorded(id=req.id, namespaces=req.namespaces, db=req.db)
    return Step([event], reply, fault(req))


def exit_critical_section(shard: Shard, req: d.ExitDDLCriticalSection) -> Step:
    reply = {"id": req.id, "critical": False}
    if req.id not in shard.documents.ddl_sections and req.id not in shard.documents.ddl_drops:
        return Step([], reply)
    return Step([d.DDLCriticalSectionRemoved(id=req.id)], reply, fault(req))


# ----------------------------------------------------------------------- drop


def drop_local_data(shard: Shard, req: d.DropLocalData) -> Step:
    if (req.ns is None) == (req.db is None):
        raise CommandError(ErrorCode.BadValue, f"DDL {req.id}: DropLocalData needs exactly one of ns and db")
    refuse_if_moved_past(shard, req)
    target = req.ns if req.ns is not None else req.db
    reply = {"id": req.id, "ns": req.ns, "db": req.db, "dropped": True}
    if target in shard.documents.ddl_drops.get(req.id, frozenset()):
        return Step([], reply)  # dropped already: documents moved in since (a rename's) stay
    events: list[Record] = [d.LocalDataDropped(id=req.id, ns=req.ns, db=req.db)]
    events += _task_removals(shard, req.ns, req.db)
    events += _index_removals(shard, req.ns, req.db)
    return Step(events, reply, fault(req))


def _index_removals(shard: Shard, ns: str | None = None, db: str | None = None) -> list[Record]:
    """The removal of the secondary indexes of `ns` (or of `db`'s collections) with a tombstone
    each, so compaction drops their records (the fold of LocalDataDropped deleted them already)."""
    out: list[Record] = []
    for name_ns in sorted(n for n in shard.documents.indexes if _in(n, ns, db)):
        for name in sorted(shard.documents.indexes[name_ns]):
            out += [ix.IndexRemoved(ns=name_ns, name=name), Tombstone(key=index_changelog_key(name_ns, name))]
    return out


def _index_moves(shard: Shard, ns: str, to: str) -> list[Record]:
    """A rename's first batch moves the ready indexes of `ns` to `to` (recorded ready there
    before any document arrives, so each is indexed as it is written) and removes them from
    `ns`; an index still building or failed is not carried (the DDL runs alone)."""
    out: list[Record] = []
    there = shard.documents.indexes.get(to, {})
    for name, index in sorted(shard.documents.indexes.get(ns, {}).items()):
        record: ix.IndexRecorded = index.record
        if record.state == "ready" and name not in there:
            out.append(record.model_copy(update={"ns": to, "scannedTo": "", "scanned": 0, "total": 0}))
        out += [ix.IndexRemoved(ns=ns, name=name), Tombstone(key=index_changelog_key(ns, name))]
    return out


# --------------------------------------------------------------------- rename


def _placer(shard: Shard, to: str) -> Callable[[Doc], bytes | None]:
    """The shard key a document gets under `to` if this shard owns it there (None: an orphan)."""
    coll = shard.catalog.collections.get(to)
    if coll is not None:

        def sharded(doc: Doc) -> bytes | None:
            try:
                skey = coll.pattern.encode_doc(doc)
            except ShardKeyError:
                return None  # unplaceable under the key (it could not be here under it either)
            return skey if owns(shard, coll, skey) else None

        return sharded
    db = shard.catalog.databases.get(to.partition(".")[0])
    mine = db is not None and db.primary == shard.id  # an unsharded collection is all its primary's
    return lambda doc: UNSHARDED_KEY if mine else None


def rename_local_batch(shard: Shard, req: d.RenameLocalBatch) -> Step:
    refuse_if_moved_past(shard, req)
    db = shard.catalog.databases.get(req.ns.partition(".")[0])
    if req.ns in shard.catalog.collections or (db is not None and req.ns in db.collections):
        raise CommandError(
            ErrorCode.StaleConfig,
            f"{shard.id}: the catalog at ConfigTime {shard.catalog.config_time} has not renamed {req.ns} yet",
            {"shard": shard.id, "configTime": shard.catalog.config_time + 1},
        )
    place = _placer(shard, req.to)
    events: list[Record] = _task_removals(shard, req.ns) + _index_moves(shard, req.ns, req.to)
    moved = removed = 0
    taken = list(itertools.islice(shard.documents.scan(req.ns), max(req.limit, 1)))
    for k, doc in taken:
        skey = place(doc)
        if skey is not None:
            events.append(s.DocumentWritten(ns=req.to, skey=skey.hex(), doc=doc))
            moved += 1
        else:
            removed += 1
        events.append(s.DocumentRemoved(ns=req.ns, skey=shard_key_part(k, doc).hex(), id=doc["_id"]))
    done = len(taken) < max(req.limit, 1)
    return Step(
        events, {"id": req.id, "moved": moved, "removed": removed, "done": done}, fault(req) if events else None
    )


# ---------------------------------------------------------------------- refine


def rekey_local_batch(shard: Shard, req: d.RekeyLocalBatch) -> Step:
    refuse_if_moved_past(shard, req)
    coll = shard.catalog.collections.get(req.ns)
    if coll is None:
        raise CommandError(ErrorCode.NamespaceNotSharded, f"{req.ns} is not sharded on {shard.id}")
    limit = max(req.limit, 1)
    after = bytes.fromhex(req.after) if req.after is not None else None
    events: list[Record] = _task_removals(shard, req.ns)
    rewritten = removed = unkeyable = examined = 0
    last: bytes | None = after
    for k, doc in shard.documents.scan(req.ns, after or b""):
        if k == after:
            continue  # exclusive
        examined += 1
        last = k
        stored = shard_key_part(k, doc)
        try:
            skey: bytes | None = coll.pattern.encode_bound(coll.pattern.extract(doc))  # missing fields: null
        except ShardKeyError:
            skey = None  # an array in a new field: left as it is, reported
        if skey is None:
            unkeyable += 1
        elif not owns(shard, coll, skey):
            events.append(s.DocumentRemoved(ns=req.ns, skey=stored.hex(), id=doc["_id"]))
            removed += 1
        elif skey != stored:
            # The old key goes through the _id index when this is applied.
            events.append(s.DocumentWritten(ns=req.ns, skey=skey.hex(), doc=doc))
            rewritten += 1
        if examined >= limit:
            break
    reply = {
        "id": req.id,
        "rewritten": rewritten,
        "removed": removed,
        "unkeyable": unkeyable,
        "after": last.hex() if last is not None else None,
        "done": examined < limit,
    }
    return Step(events, reply, fault(req) if events else None)
