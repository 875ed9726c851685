"""The balancer's durable state: the fold of `balancer.events`, persisted entity per
key (so a restart loads it instead of replaying history), and the decisions on
`balancer.commands`.

    a/<action id>  -> an action issued and not finished yet
    d/<ns>         -> a collection's defragmentation: {"started", "state": defragment.to_json(...)},
                      kept once finished (for `defragment NS status`)
    round          -> the last completed round's number, time and summary
    automerge      -> when the auto-merger last ran
"""

from __future__ import annotations

import json

from domain.protocol import ErrorCode
from libs.commands import CommandError, Decision
from libs.store import Store
from schemas import Record
from schemas import balancer as b
from services.balancer import defragment


def event_key(e: Record) -> bytes:
    """The Kafka key of a balancer event: the entity it is about (compaction keeps the latest)."""
    if isinstance(e, (b.ActionIssued, b.ActionFinished)):
        return b"a/" + (e.action["id"] if isinstance(e, b.ActionIssued) else e.id).encode()
    if isinstance(e, b.DefragmentationChanged):
        return b"d/" + e.ns.encode()
    return e.type.encode()  # RoundCompleted, AutoMergeRan: only the latest matters


class BalancerState:
    def __init__(self) -> None:
        self.in_flight: dict[str, dict] = {}  # action id -> action (with "round")
        self.defragmenting: dict[str, dict] = {}  # ns -> {"started", "state"}, finished ones too
        self.last_round: dict = {"round": 0, "at": None, "summary": {}}
        self.auto_merged_at: float = 0.0
        self.recent_failures: list[dict] = []  # in memory only: for `balancer status`
        self._changes: dict[bytes, bytes | None] = {}

    # ---------------------------------------------------------- State protocol

    def load(self, store: Store) -> None:
        self.__init__()
        for k, v in store.scan(b"a/"):
            self.in_flight[k[2:].decode()] = json.loads(v)
        for k, v in store.scan(b"d/"):
            self.defragmenting[k[2:].decode()] = json.loads(v)
        if (raw := store.get(b"round")) is not None:
            self.last_round = json.loads(raw)
        if (raw := store.get(b"automerge")) is not None:
            self.auto_merged_at = json.loads(raw)

    def drain_changes(self) -> dict[bytes, bytes | None]:
        out, self._changes = self._changes, {}
        return out

    def _put(self, key: bytes, value) -> None:
        self._changes[key] = None if value is None else json.dumps(value, separators=(",", ":")).encode()

    def apply(self, e: Record, offset: int) -> None:
        if isinstance(e, b.ActionIssued):
            action = {**e.action, "round": e.round}
            self.in_flight[action["id"]] = action
            self._put(b"a/" + action["id"].encode(), action)
        elif isinstance(e, b.ActionFinished):
            action = self.in_flight.pop(e.id, None)
            self._put(b"a/" + e.id.encode(), None)
            if not e.ok and action is not None:
                self.recent_failures = (self.recent_failures + [{**action, "error": e.error, "code": e.code}])[-20:]
        elif isinstance(e, b.RoundCompleted):
            self.last_round = {"round": e.round, "at": e.at, "summary": e.summary}
            self._put(b"round", self.last_round)
        elif isinstance(e, b.DefragmentationChanged):
            if e.state is None:
                self.defragmenting.pop(e.ns, None)
            else:
                self.defragmenting[e.ns] = e.state
            self._put(b"d/" + e.ns.encode(), e.state)
        elif isinstance(e, b.AutoMergeRan):
            self.auto_merged_at = e.at
            self._put(b"automerge", e.at)

    def blocks_balancing(self, ns: str) -> bool:
        """Seed 002: a collection being defragmented is not balanced (nor auto-merged) meanwhile."""
        doc = self.defragmenting.get(ns)
        return doc is not None and doc["state"]["phase"] != defragment.FINISHED

    def defrag_status(self, ns: str) -> dict | None:
        doc = self.defragmenting.get(ns)
        return (
            None
            if doc is None
            else {**defragment.status(defragment.from_json(doc["state"])), "started": doc["started"]}
        )

    # --------------------------------------------------------------- decide

    def decide(self, cmd: Record) -> Decision:
        import time

        if isinstance(cmd, b.IssueActions):
            fresh = [a for a in cmd.actions if a["id"] not in self.in_flight]
            return Decision([b.ActionIssued(round=cmd.round, action=a) for a in fresh], {"issued": len(fresh)})
        if isinstance(cmd, b.FinishAction):
            if cmd.id not in self.in_flight:
                return Decision([], {"id": cmd.id, "finished": False})
            return Decision(
                [b.ActionFinished(id=cmd.id, ok=cmd.ok, error=cmd.error, code=cmd.code)],
                {"id": cmd.id, "finished": True},
            )
        if isinstance(cmd, b.CompleteRound):
            return Decision(
                [b.RoundCompleted(round=cmd.round, at=time.time(), summary=cmd.summary)], {"round": cmd.round}
            )
        if isinstance(cmd, b.StartDefragmentation):
            if self.blocks_balancing(cmd.ns):
                return Decision([], {"ns": cmd.ns, "started": False, "status": self.defrag_status(cmd.ns)})
            doc = {"started": time.time(), "state": defragment.to_json(defragment.start(cmd.ns))}
            return Decision([b.DefragmentationChanged(ns=cmd.ns, state=doc)], {"ns": cmd.ns, "started": True})
        if isinstance(cmd, b.StopDefragmentation):
            if not self.blocks_balancing(cmd.ns):
                return Decision([], {"ns": cmd.ns, "stopped": False})
            doc = self.defragmenting[cmd.ns]
            state = defragment.to_json(defragment.stop(defragment.from_json(doc["state"])))
            return Decision(
                [b.DefragmentationChanged(ns=cmd.ns, state={**doc, "state": state})], {"ns": cmd.ns, "stopped": True}
            )
        if isinstance(cmd, b.SetDefragmentation):
            doc = self.defragmenting.get(cmd.ns)
            if doc is None or doc["started"] != cmd.started or cmd.state is None:
                return Decision([], {"ns": cmd.ns, "applied": False})  # stopped and started again meanwhile
            state = cmd.state
            if doc["state"]["stopped"] and not state["stopped"]:  # a stop came in while the step was taken
                state = defragment.to_json(defragment.stop(defragment.from_json(state)))
            return Decision(
                [b.DefragmentationChanged(ns=cmd.ns, state={**doc, "state": state})],
                {"ns": cmd.ns, "applied": True, "state": state},
            )
        if isinstance(cmd, b.MarkAutoMerge):
            return Decision([b.AutoMergeRan(at=cmd.at)], {"at": cmd.at})
        if isinstance(cmd, b.GetBalancerState):
            return Decision([], self.document())
        raise CommandError(ErrorCode.CommandNotFound, f"unknown balancer command {cmd.type!r}")

    def document(self) -> dict:
        return {
            "lastRound": self.last_round,
            "inFlight": list(self.in_flight.values()),
            "defragmenting": {ns: self.defrag_status(ns) for ns in self.defragmenting},
            "autoMergedAt": self.auto_merged_at,
            "recentFailures": self.recent_failures,
        }
