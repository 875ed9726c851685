"""Records of the balancer's own log: `balancer.commands` in (from the CLI and from
the balancer's round loop), `balancer.events` out.  Its state — actions in flight,
defragmentation per collection, the auto-merger's schedule, the last round — is
the fold of `balancer.events`, so a new leader resumes where the old one stopped.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, SerializationInfo, SerializerFunctionWrapHandler, model_serializer

from schemas import Codec, Record

Doc = dict[str, Any]
Bound = dict[str, Any]  # Extended JSON

# ----------------------------------------------------------------- actions
#
# What the balancer sends, recorded before it is sent (IssueActions / ActionIssued) so
# that a new leader finishes it.  `kind` tells the records apart; `by` names the secondary
# loop that issued (and finishes) the action, absent for the round loop's.  The JSON is
# the one earlier versions wrote as plain dicts: "from"/"to" for donor and recipient, no
# "by" key for a round's action.

Loop = Literal["defragmentation", "autoMerge"]


class _Action(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_by_name=True, validate_by_alias=True, serialize_by_alias=True
    )

    id: str
    ns: str

    @model_serializer(mode="wrap")
    def _json(self, handler: SerializerFunctionWrapHandler, info: SerializationInfo) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        if out.get("by", 0) is None:
            del out["by"]  # a round's action: no key, as written before actions were typed
        return out

    @property
    def secondary(self) -> bool:
        """Issued by the secondary loop (defragmentation, auto-merger), which finishes it itself."""
        return getattr(self, "by", None) is not None

    def to_json(self) -> Doc:
        return self.model_dump(by_alias=True)


class ChunkRangeDoc(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    min: Bound
    max: Bound


class SplitAction(_Action):
    """Split a chunk at zone boundaries (the policy's split)."""

    kind: Literal["split"] = "split"
    chunk: ChunkRangeDoc
    at: list[Bound]


class AutoSplitAction(_Action):
    """Split a chunk grown to the max chunk size at its owner's split points; `edge`: the
    top or bottom chunk of an ascending key, whose new edge chunk then moves off the shard."""

    kind: Literal["autoSplit"] = "autoSplit"
    min: Bound
    max: Bound
    shard: str
    limit: int
    edge: Literal["top", "bottom"] | None = None


class MigrationAction(_Action):
    """Move [min, max) to the recipient (max None: up to one max chunk size of data from min)."""

    kind: Literal["migration"] = "migration"
    donor: str = Field(alias="from")
    recipient: str = Field(alias="to")
    min: Bound
    max: Bound | None
    reason: Literal["drain", "zoneViolation", "chunksImbalance", "defragmentation"]
    by: Literal["defragmentation"] | None = None


class MergeAction(_Action):
    """Merge the chunks of [min, max), all on `shard`."""

    kind: Literal["merge"] = "merge"
    shard: str
    min: Bound
    max: Bound
    by: Loop | None = None


class DataSizeAction(_Action):
    """Measure the chunk [min, max) from its owner's first statistics report taken at
    ConfigTime `after` or later (the balancer's ConfigTime when it issued the action)."""

    kind: Literal["dataSize"] = "dataSize"
    shard: str
    min: Bound
    max: Bound
    after: int
    by: Literal["defragmentation"] | None = None


class MovePrimaryAction(_Action):
    """Move the primary of database `ns` off a draining shard."""

    kind: Literal["movePrimary"] = "movePrimary"
    donor: str = Field(alias="from")
    recipient: str = Field(alias="to")


class RemoveShardAction(_Action):
    """Finish removing a drained shard (`ns` is empty)."""

    kind: Literal["removeShard"] = "removeShard"
    shard: str


Action = Annotated[
    SplitAction
    | AutoSplitAction
    | MigrationAction
    | MergeAction
    | DataSizeAction
    | MovePrimaryAction
    | RemoveShardAction,
    Field(discriminator="kind"),
]

# ---------------------------------------------------------------- commands


class IssueActions(Record):
    """Record actions before they are sent (to the config server), so a restarted
    balancer knows what it already issued and does not issue it twice."""

    type: Literal["IssueActions"] = "IssueActions"
    v: Literal[1] = 1
    round: int
    actions: list[Action]


class FinishAction(Record):
    """An action's outcome: ok, or the error's `code` (an ErrorCode name) and `error`, the reason."""

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
    action: Action


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
