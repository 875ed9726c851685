"""Range deletion: the orphans a migration leaves, deleted in batches once it is decided.

A task is recorded, pending, with the migration document that may leave orphans: by
the donor (its copy of the range, orphaned if the migration commits) and by the
recipient (its partial copy, orphaned if it aborts).  The decision makes it ready or
removes it; the range deleter then sends DeleteRangeBatch until the task is removed.

The state is not stored as a string: it is `RangeDeletionRecorded.pending`.

    request / event              expects    leaves
    StartDonation, StartReceipt  (none)     pending                 (donor.py, recipient.py)
    RecordDecision committed     pending    ready at now, after the commit's ConfigTime
    RecordDecision aborted       pending    (removed): the range stays the donor's
    FinishReceipt committed      pending    (removed): the documents are the recipient's now
    FinishReceipt aborted        pending    ready at now, after the recipient's ConfigTime
    DeleteRangeBatch             pending    pending, waiting: the migration is not decided
    DeleteRangeBatch             ready      ready, waiting: a query older than the commit still reads
    DeleteRangeBatch             ready      ready with `deleted` counted, or (removed) after the
                                            last batch (one shorter than the limit)
    DeleteRangeBatch             (none)     (none): done already
    DeleteRangeBatch             any        (removed) if the collection was dropped since

The range deleter keeps the cleanup delay (`readyAt` + orphanCleanupDelaySecs); the
shard keeps the rest, and never deletes a document of a chunk it owns again.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import StrEnum

from libs.faults import reintroduced
from schemas import Record
from schemas import shard as s
from services.shard.documents import shard_key_part
from services.shard.protocol.common import Doc, Shard, Step, owns, range_keys

# Queries of a collection (ns) that started before a ConfigTime and are still open.
OpenQueries = Callable[[str, int], int]


class TaskState(StrEnum):
    PENDING = "pending"  # its migration is not decided: the range may stay where it is
    READY = "ready"  # orphans: to delete once the cleanup delay passed and older queries ended


def state_of(task: s.RangeDeletionRecorded) -> TaskState:
    return TaskState.PENDING if task.pending else TaskState.READY


def pending(shard: Shard, mid: str, ns: str, epoch: str, lo: Doc, hi: Doc, why: str) -> s.RangeDeletionRecorded:
    """The task recorded with a migration document, before the migration is decided; it keeps
    the migration's trace (from the catalog, which the request's ConfigTime brought up to date),
    so that its deletion batches are spans of that trace."""
    m = shard.catalog.migrations.get(mid)
    return s.RangeDeletionRecorded(
        id=mid, ns=ns, epoch=epoch, min=lo, max=hi, why=why, traceparent=m.traceparent if m else ""
    )


def ready(
    task: s.RangeDeletionRecorded, now: float, config_time: int, why: str | None = None
) -> s.RangeDeletionRecorded:
    """The task once its range is orphaned: queries routed before `config_time` may still read it."""
    update: dict[str, object] = {"pending": False, "readyAt": now, "configTime": config_time}
    if why is not None:
        update["why"] = why
    return task.model_copy(update=update)


def waiting_for(task: s.RangeDeletionRecorded, open_before: int) -> str | None:
    """Why the task may not delete now (None: it may), apart from the cleanup delay, which the
    range deleter keeps.  `open_before`: the queries of its collection that started before
    the migration committed and are still open."""
    if state_of(task) is TaskState.PENDING:
        return "its migration is not decided yet"
    if open_before:
        one = open_before == 1
        return (
            f"{open_before} quer{'y' if one else 'ies'} started before the migration "
            f"committed still read{'s' if one else ''} the range"
        )
    return None


def delete_batch(shard: Shard, req: s.DeleteRangeBatch, open_queries: OpenQueries) -> Step:
    """DeleteRangeBatch: up to `req.limit` orphans of the task's range (see the table above)."""
    task = shard.documents.range_tasks.get(req.task)
    if task is None:
        return Step([], {"task": req.task, "deleted": 0, "done": True})
    coll = shard.catalog.collections.get(task.ns)
    if coll is None:  # dropped since: nothing of it is ours to keep
        return Step([s.RangeDeletionRemoved(id=task.id)], {"task": req.task, "deleted": 0, "done": True})
    open_before = open_queries(task.ns, task.configTime) if state_of(task) is TaskState.READY else 0
    if (why := waiting_for(task, open_before)) is not None:
        return Step([], {"task": req.task, "deleted": 0, "done": False, "waiting": why})
    lo, hi = range_keys(shard.catalog, task.ns, task.min, task.max)
    events: list[Record] = []
    for k, doc in shard.documents.scan(task.ns, lo, hi):
        skey = shard_key_part(k, doc)
        if owns(shard, coll, skey) and not reintroduced("range-deletion-deletes-owned"):
            continue  # never delete what this shard owns (the range came back)
        events.append(s.DocumentRemoved(ns=task.ns, skey=skey.hex(), id=doc["_id"]))
        if len(events) >= req.limit:
            break
    deleted = task.deleted + len(events)
    done = len(events) < req.limit
    events.append(s.RangeDeletionRemoved(id=task.id) if done else task.model_copy(update={"deleted": deleted}))
    return Step(events, {"task": req.task, "deleted": len(events) - 1, "total": deleted, "done": done})
