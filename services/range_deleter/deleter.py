"""The range deleter's policy, pure: which task to delete next, and why every other one waits.

Shared by the service and `shardlog range-deletions`, so that what the CLI says is
what the service does.  A task is a dict as a shard's `ListMigrations` lists it
(the `RangeDeletionRecorded` fields plus "shard", "left" and "waiting", the
shard's own reason not to delete now).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

Task = Mapping[str, Any]  # a task as ListMigrations lists it (JSON)
Key = tuple[str, str]  # (shard, task id): one migration's id can name a task on its donor and on its recipient


class Settings(Protocol):
    orphanCleanupDelaySecs: int


def key(task: Task) -> Key:
    return task["shard"], task["id"]


def state(task: Task) -> str:
    if task.get("pending"):
        return "pending"
    return "deleting" if task.get("deleted") else "ready"


def waiting_for(task: Task, settings: Settings, now: float, held: str | None = None) -> str | None:
    """Why the task may not be deleted now (None: it may); `held` is the service's own reason."""
    if task.get("pending"):
        return "pending: its migration is not decided"
    reasons = []
    # A decided task always has readyAt; were it missing, waiting for ever would leak the orphans.
    left = (task.get("readyAt") or 0.0) + settings.orphanCleanupDelaySecs - now
    if left > 0:  # queries routed with the old routing may still read the range (docs/reference/range-deletion.md)
        reasons.append(f"orphanCleanupDelaySecs: {math.ceil(left)} s left")
    if task.get("waiting"):
        reasons.append(task["waiting"])
    if held:
        reasons.append(held)
    return "; ".join(reasons) or None


@dataclass(frozen=True)
class Plan:
    next: dict[str, Any] | None  # the task to delete now, if any
    waiting: dict[Key, str | None]  # every task's reason to wait; None only for `next`


def plan(
    tasks: Sequence[dict[str, Any]], settings: Settings, now: float, held: Mapping[Key, str] | None = None
) -> Plan:
    """`held`: tasks the service holds back (e.g. a batch failed), with the reason."""
    held = held or {}
    waiting = {key(t): waiting_for(t, settings, now, held.get(key(t))) for t in tasks}
    # A task in progress first (after a restart the deleter finishes what it started rather than
    # leave two half-deleted ranges), then the oldest orphans.
    nxt = min(
        (t for t in tasks if waiting[key(t)] is None),
        key=lambda t: (not t.get("deleted"), t.get("readyAt") or 0.0, *key(t)),
        default=None,
    )
    if nxt is not None:  # one task at a time: the other ready ones queue behind it
        for k, why in waiting.items():
            if why is None and k != key(nxt):
                waiting[k] = f"queued behind task {nxt['id']} on {nxt['shard']}"
    return Plan(nxt, waiting)
