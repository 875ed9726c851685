"""Records of the balancer's own log: `balancer.commands` in (from the CLI and from
the balancer's round loop), `balancer.events` out.  Its state — actions in flight,
defragmentation per collection, the auto-merger's schedule, the last round — is
the fold of `balancer.events`, so a new leader resumes where the old one stopped.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field

from schemas import Codec, Record

Doc = dict[str, Any]

# ---------------------------------------------------------------- commands


class IssueActions(Record):
    """Record actions before they are sent (to the config server), so a restarted
    balancer knows what it already issued and does not issue it twice."""

    type: Literal["IssueActions"] = "IssueActions"
    v: Literal[1] = 1
    round: int
    actions: list[Doc]  # {"id", "kind": "split"|"migration"|"merge"|"dataSize", "ns", ...}
    # ("by": "defragmentation"|"autoMerge" for the secondary loop's actions, which it finishes itself)


class FinishAction(Record):
    type: Literal["FinishAction"] = "FinishAction"
    v: Literal[1] = 1
    id: str
    ok: bool
    error: str | None = None
    code: str | None = None


class CompleteRound(Record):
    type: Literal["CompleteRound"] = "CompleteRound"
    v: Literal[1] = 1
    round: int
    summary: Doc


class StartDefragmentation(Record):
    type: Literal["StartDefragmentation"] = "StartDefragmentation"
    v: Literal[1] = 1
    ns: str


class StopDefragmentation(Record):
    type: Literal["StopDefragmentation"] = "StopDefragmentation"
    v: Literal[1] = 1
    ns: str


class SetDefragmentation(Record):
    """A step of a collection's defragmentation (`defragment.to_json`), persisted so a new
    balancer resumes the same phase.  Refused unless `started` names the current run (a
    stop and a new start make an older run's steps moot); a stop that came in meanwhile
    is applied to `state`."""

    type: Literal["SetDefragmentation"] = "SetDefragmentation"
    v: Literal[1] = 1
    ns: str
    started: float | None = None  # the run's start time, as recorded by StartDefragmentation
    state: Doc | None


class MarkAutoMerge(Record):
    type: Literal["MarkAutoMerge"] = "MarkAutoMerge"
    v: Literal[1] = 1
    at: float  # unix time the auto-merger last ran


class GetBalancerState(Record):
    """Read-only: rounds, actions in flight, defragmentation, auto-merger."""

    type: Literal["GetBalancerState"] = "GetBalancerState"
    v: Literal[1] = 1
    ns: str | None = None  # also: this collection's compliance, every violation with its reason
    snapshot: bool = False  # also: the cluster snapshot the policy would see now


BalancerCommand = Annotated[
    IssueActions
    | FinishAction
    | CompleteRound
    | StartDefragmentation
    | StopDefragmentation
    | SetDefragmentation
    | MarkAutoMerge
    | GetBalancerState,
    Field(discriminator="type"),
]
COMMANDS = (
    IssueActions,
    FinishAction,
    CompleteRound,
    StartDefragmentation,
    StopDefragmentation,
    SetDefragmentation,
    MarkAutoMerge,
    GetBalancerState,
)

# ------------------------------------------------------------------ events


class ActionIssued(Record):
    type: Literal["ActionIssued"] = "ActionIssued"
    v: Literal[1] = 1
    round: int
    action: Doc


class ActionFinished(Record):
    type: Literal["ActionFinished"] = "ActionFinished"
    v: Literal[1] = 1
    id: str
    ok: bool
    error: str | None = None
    code: str | None = None


class RoundCompleted(Record):
    type: Literal["RoundCompleted"] = "RoundCompleted"
    v: Literal[1] = 1
    round: int
    at: float
    summary: Doc


class DefragmentationChanged(Record):
    type: Literal["DefragmentationChanged"] = "DefragmentationChanged"
    v: Literal[1] = 1
    ns: str
    state: Doc | None  # {"started", "state": defragment.to_json(...)}; None: never defragmented


class AutoMergeRan(Record):
    type: Literal["AutoMergeRan"] = "AutoMergeRan"
    v: Literal[1] = 1
    at: float


BalancerEvent = Annotated[
    ActionIssued | ActionFinished | RoundCompleted | DefragmentationChanged | AutoMergeRan, Field(discriminator="type")
]
EVENTS = (ActionIssued, ActionFinished, RoundCompleted, DefragmentationChanged, AutoMergeRan)

commands: Codec[BalancerCommand] = Codec("balancer.commands", BalancerCommand, COMMANDS)
events: Codec[BalancerEvent] = Codec("balancer.events", BalancerEvent, EVENTS)
