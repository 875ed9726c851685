"""Where a command processor's transaction puts the consumed offsets (docs/reference/
command-processor.md, "Where the consumed offsets go"): on its events when it writes any, in the
consumer group when it writes none (before its first write), and in the group too once that has
lagged long enough.  Against a producer that records what it is asked of the bus, in order."""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Literal

import pytest

from libs.commands import CORRELATION_ID, REPLY_TO, CommandError, CommandProcessor, Decision, Policy, settings
from libs.commands.batch import Pending
from libs.projection import COMMAND_END, Projection
from libs.store import Store
from schemas import Codec, Record


class Cmd(Record):
    type: Literal["Cmd"] = "Cmd"
    v: Literal[1] = 1
    write: bool


class Ev(Record):
    type: Literal["Ev"] = "Ev"
    v: Literal[1] = 1


@dataclass
class Command:
    """A consumed command record (what the processor reads of one)."""

    offset: int
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ((REPLY_TO, b"inbox"), (CORRELATION_ID, b"c"))
    topic: str = "commands"
    partition: int = 0
    key: bytes | None = None


@dataclass
class Sent:
    topic: str
    headers: list[tuple[str, bytes]]


class Producer:
    """What the processor asks of its transactional producer, in order."""

    def __init__(self) -> None:
        self.calls: list[Any] = []
        self.offsets: dict[str, int] = {}

    async def begin(self) -> None:
        self.calls.append("begin")

    async def send_offsets(self, group: str, topic: str, partition: int, offset: int) -> None:
        self.calls.append(("offsets", offset))

    async def send(self, topic: str, value: bytes | None, *, key=None, headers=None, partition=None) -> asyncio.Future:
        self.calls.append(Sent(topic, list(headers or [])))
        at = self.offsets.get(topic, 0)
        self.offsets[topic] = at + 1
        done: asyncio.Future = asyncio.get_running_loop().create_future()
        done.set_result(at)
        return done

    async def partitions_for(self, topic: str) -> set[int]:
        return {0}

    async def commit(self) -> None:
        self.calls.append("commit")


class State:
    def load(self, store: Store) -> None: ...

    def apply(self, event: Record, offset: int) -> None: ...

    def drain_changes(self) -> dict[bytes, bytes | None]:
        return {}


class Seeks:
    def seek(self, offset: int) -> None: ...


class OnePhase(Policy):
    """A write gives two events; every reply leaves with its events."""

    one_phase_replies = True

    def decide(self, command: Record) -> Decision:
        assert isinstance(command, Cmd)
        if not command.write:
            raise CommandError("Refused", "no")
        return Decision(events=[Ev(), Ev()])

    def replies_with_events(self, command: Record) -> bool:
        return True


@pytest.fixture
def processor(tmp_path):
    projection = Projection("unused:9092", "events", Codec("ev", Ev, (Ev,)), State(), Store(tmp_path / "db"))  # type: ignore[arg-type]
    projection._reader = Seeks()  # type: ignore[assignment]
    p = CommandProcessor(
        bus="unused:9092",
        command_topic="commands",
        command_codec=Codec("cmd", Cmd, (Cmd,)),  # type: ignore[arg-type]
        projection=projection,
        policy=OnePhase(),
        dead_letters="dead",
        group_id="group",
        name="test",
    )
    p._producer = Producer()  # type: ignore[assignment]
    yield p
    projection.store.close()


def batch(*writes: bool) -> list:
    return [Pending(Command(i, Cmd(write=w).model_dump_json().encode()), None) for i, w in enumerate(writes)]


async def test_a_transaction_that_writes_events_records_the_offsets_on_them_not_in_the_group(processor):
    await processor.transact(batch(True, True), 2)
    producer = processor._producer
    assert not [c for c in producer.calls if isinstance(c, tuple)], "no send_offsets_to_transaction"
    events = [c for c in producer.calls if isinstance(c, Sent) and c.topic == "events"]
    assert len(events) == 4 and all((COMMAND_END, b"2") in e.headers for e in events)
    assert processor.projection.command_end == 2 and processor.projection.position == 4
    ckpt = processor.projection.store.checkpoint("events")
    assert ckpt is not None and ckpt.command_end == 2
    assert processor.group.behind == 2, "the group has not got them yet"


async def test_a_transaction_that_writes_no_event_commits_the_offsets_to_the_group_first(processor):
    processor.group.lags(1)  # a read answered before, say
    await processor.transact(batch(False), 3)
    calls = processor._producer.calls
    assert calls[:2] == ["begin", ("offsets", 3)], "before its first write (the reply)"
    assert processor.group.behind is None and processor.projection.command_end is None


async def test_a_refusal_before_a_write_puts_the_offsets_in_the_group_before_its_reply(processor):
    await processor.transact(batch(False, True), 2)
    calls = processor._producer.calls
    assert calls[1] == ("offsets", 2) and isinstance(calls[2], Sent) and calls[2].topic == "inbox"
    # the events still carry it (harmless: the larger of the two counts)
    assert all((COMMAND_END, b"2") in c.headers for c in calls if isinstance(c, Sent) and c.topic == "events")
    assert processor.group.behind is None


async def test_the_group_gets_the_offsets_once_it_has_lagged_half_the_commit_interval(processor):
    await processor.transact(batch(True), 1)
    assert processor.group.behind == 1
    processor.group.since = time.monotonic() - settings.READ_OFFSETS_COMMIT_S / 2
    await processor.transact(batch(True), 2)
    calls = processor._producer.calls
    assert calls[calls.index("commit") + 1 :][:2] == ["begin", ("offsets", 2)]
    assert processor.group.behind is None and processor.projection.command_end == 2
