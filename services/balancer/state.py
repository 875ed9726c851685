"""The balancer's durable state: the fold of `balancer.events`, persisted entity per
key (so a restart loads it instead of replaying history), and the decisions on
`balancer.commands`.

    a/<action id>  -> an action issued and not finished yet (its JSON, with "round")
    d/<ns>         -> a collection's defragmentation: {"started", "state": defragment.to_json(...)},
                      kept once finished (for `defragment NS status`)
    round          -> the last completed round's number, time and summary
    automerge      -> when the auto-merger last ran

Events are applied and commands decided through one `Dispatch` table each.
"""

from __future__ import annotations

import json
import time
from typing import Any

from pydantic import TypeAdapter

from domain.protocol import ErrorCode
from libs.commands import CommandError, Decision
from libs.dispatch import Dispatch
from libs.store import Store
from schemas import Record
from schemas import balancer as b
from services.balancer import defragment

Doc = dict[str, Any]

on_event: Dispatch[BalancerState, None] = Dispatch("balancer event")
on_command: Dispatch[BalancerState, Decision] = Dispatch("balancer command")
event_keys: Dispatch[None, bytes] = Dispatch("balancer event key")

_action = TypeAdapter[b.Action](b.Action)


def event_key(e: Record) -> bytes:
    """The Kafka key of a balancer event: the entity it is about (compaction keeps the latest)."""
    return event_keys(None, e)


@event_keys.register(b.ActionIssued)
def _issued_key(_: None, e: b.ActionIssued) -> bytes:
    return b"a/" + e.action.id.encode()


@event_keys.register(b.ActionFinished)
def _finished_key(_: None, e: b.ActionFinished) -> bytes:
    return b"a/" + e.id.encode()


@event_keys.register(b.DefragmentationChanged)
def _defrag_key(_: None, e: b.DefragmentationChanged) -> bytes:
    return b"d/" + e.ns.encode()


@event_keys.register(b.RoundCompleted)
def _round_key(_: None, e: b.RoundCompleted) -> bytes:
    return e.type.encode()  # only the latest matters


@event_keys.register(b.AutoMergeRan)
def _auto_merge_key(_: None, e: b.AutoMergeRan) -> bytes:
    return e.type.encode()  # only the latest matters


class BalancerState:
    def __init__(self) -> None:
        self.in_flight: dict[str, b.Action] = {}  # action id -> action
        self.rounds: dict[str, int] = {}  # action id -> the round that issued it
        self.defragmenting: dict[str, Doc] = {}  # ns -> {"started", "state"}, finished ones too
        self.last_round: Doc = {"round": 0, "at": None, "summary": {}}
        self.auto_merged_at: float = 0.0
        self.recent_failures: list[Doc] = []  # in memory only: for `balancer status`
        self._changes: dict[bytes, bytes | None] = {}

    # ---------------------------------------------------------- State protocol

    def load(self, store: Store) -> None:
        self.__init__()  # type: ignore[misc]
        for _, v in store.scan(b"a/"):
            doc = json.loads(v)
            round_no = doc.pop("round")
            action = _action.validate_python(doc)
            self.in_flight[action.id], self.rounds[action.id] = action, round_no
        for k, v in store.scan(b"d/"):
            self.defragmenting[k[2:].decode()] = json.loads(v)
        if (raw := store.get(b"round")) is not None:
            self.last_round = json.loads(raw)
        if (raw := store.get(b"automerge")) is not None:
            self.auto_merged_at = json.loads(raw)

    def drain_changes(self) -> dict[bytes, bytes | None]:
        out, self._changes = self._changes, {}
        return out

    def _put(self, key: bytes, value: Any) -> None:
        self._changes[key] = None if value is None else json.dumps(value, separators=(",", ":")).encode()

    def apply(self, e: Record, offset: int) -> None:
        on_event(self, e)

    def issued(self, action_id: str) -> Doc:
        """An action in flight as JSON, with the round that issued it."""
        return {**self.in_flight[action_id].to_json(), "round": self.rounds[action_id]}

    @on_event.register(b.ActionIssued)
    def _action_issued(self, e: b.ActionIssued) -> None:
        self.in_flight[e.action.id], self.rounds[e.action.id] = e.action, e.round
        self._put(b"a/" + e.action.id.encode(), self.issued(e.action.id))

    @on_event.register(b.ActionFinished)
    def _action_finished(self, e: b.ActionFinished) -> None:
        if e.id in self.in_flight:
            doc = self.issued(e.id)
            del self.in_flight[e.id], self.rounds[e.id]
            if not e.ok:
                self.recent_failures = (self.recent_failures + [{**doc, "error": e.error, "code": e.code}])[-20:]
        self._put(b"a/" + e.id.encode(), None)

    @on_event.register(b.RoundCompleted)
    def _round_completed(self, e: b.RoundCompleted) -> None:
        self.last_round = {"round": e.round, "at": e.at, "summary": e.summary}
        self._put(b"round", self.last_round)

    @on_event.register(b.DefragmentationChanged)
    def _defragmentation_changed(self, e: b.DefragmentationChanged) -> None:
        if e.state is None:
            self.defragmenting.pop(e.ns, None)
        else:
            self.defragmenting[e.ns] = e.state
        self._put(b"d/" + e.ns.encode(), e.state)

    @on_event.register(b.AutoMergeRan)
    def _auto_merge_ran(self, e: b.AutoMergeRan) -> None:
        self.auto_merged_at = e.at
        self._put(b"automerge", e.at)

    # ---------------------------------------------------------------- queries

    def blocks_balancing(self, ns: str) -> bool:
        """A collection being defragmented is not balanced (nor auto-merged) meanwhile."""
        doc = self.defragmenting.get(ns)
        return doc is not None and doc["state"]["phase"] != defragment.FINISHED

    def defrag_status(self, ns: str) -> Doc | None:
        doc = self.defragmenting.get(ns)
        return (
            None
            if doc is None
            else {**defragment.status(defragment.from_json(doc["state"])), "started": doc["started"]}
        )

    def busy_shards(self) -> set[str]:
        """Shards taking part in a migration or primary move in flight."""
        return {
            shard
            for a in self.in_flight.values()
            if isinstance(a, (b.MigrationAction, b.MovePrimaryAction))
            for shard in (a.donor, a.recipient)
        }

    def document(self) -> Doc:
        return {
            "lastRound": self.last_round,
            "inFlight": [self.issued(i) for i in self.in_flight],
            "defragmenting": {ns: self.defrag_status(ns) for ns in self.defragmenting},
            "autoMergedAt": self.auto_merged_at,
            "recentFailures": self.recent_failures,
        }

    # --------------------------------------------------------------- decide

    def decide(self, cmd: Record) -> Decision:
        if not on_command.handles(cmd):
            raise CommandError(ErrorCode.CommandNotFound, f"unknown balancer command {getattr(cmd, 'type', cmd)!r}")
        return on_command(self, cmd)

    @on_command.register(b.IssueActions)
    def _issue_actions(self, cmd: b.IssueActions) -> Decision:
        fresh = [a for a in cmd.actions if a.id not in self.in_flight]
        return Decision([b.ActionIssued(round=cmd.round, action=a) for a in fresh], {"issued": len(fresh)})

    @on_command.register(b.FinishAction)
    def _finish_action(self, cmd: b.FinishAction) -> Decision:
        if cmd.id not in self.in_flight:
            return Decision([], {"id": cmd.id, "finished": False})
        return Decision(
            [b.ActionFinished(id=cmd.id, ok=cmd.ok, error=cmd.error, code=cmd.code)], {"id": cmd.id, "finished": True}
        )

    @on_command.register(b.CompleteRound)
    def _complete_round(self, cmd: b.CompleteRound) -> Decision:
        return Decision([b.RoundCompleted(round=cmd.round, at=time.time(), summary=cmd.summary)], {"round": cmd.round})

    @on_command.register(b.StartDefragmentation)
    def _start_defragmentation(self, cmd: b.StartDefragmentation) -> Decision:
        if self.blocks_balancing(cmd.ns):
            return Decision([], {"ns": cmd.ns, "started": False, "status": self.defrag_status(cmd.ns)})
        doc = {"started": time.time(), "state": defragment.to_json(defragment.start(cmd.ns))}
        return Decision([b.DefragmentationChanged(ns=cmd.ns, state=doc)], {"ns": cmd.ns, "started": True})

    @on_command.register(b.StopDefragmentation)
    def _stop_defragmentation(self, cmd: b.StopDefragmentation) -> Decision:
        if not self.blocks_balancing(cmd.ns):
            return Decision([], {"ns": cmd.ns, "stopped": False})
        doc = self.defragmenting[cmd.ns]
        state = defragment.to_json(defragment.stop(defragment.from_json(doc["state"])))
        return Decision(
            [b.DefragmentationChanged(ns=cmd.ns, state={**doc, "state": state})], {"ns": cmd.ns, "stopped": True}
        )

    @on_command.register(b.SetDefragmentation)
    def _set_defragmentation(self, cmd: b.SetDefragmentation) -> Decision:
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

    @on_command.register(b.MarkAutoMerge)
    def _mark_auto_merge(self, cmd: b.MarkAutoMerge) -> Decision:
        return Decision([b.AutoMergeRan(at=cmd.at)], {"at": cmd.at})

    @on_command.register(b.GetBalancerState)
    def _get_state(self, cmd: b.GetBalancerState) -> Decision:
        return Decision([], self.document())
