"""The projection remembers the command position its log's writer records on its records
(libs.projection.COMMAND_END), with its checkpoint, so that a new owner of the commands knows
where they resume (docs/reference/command-processor.md)."""

from __future__ import annotations

from dataclasses import dataclass, field

from libs.projection import COMMAND_END, Projection, recorded_command_end
from libs.store import Store
from schemas import Record


@dataclass
class FakeRecord:
    offset: int
    value: bytes | None = b"{}"
    key: bytes | None = None
    headers: tuple[tuple[str, bytes], ...] = ()


class Event(Record):
    type: str = "E"


class Codec:
    def decode(self, raw: bytes) -> Record:
        return Event()


@dataclass
class Counting:
    """A state that counts the events it applied (and keeps the count in the store)."""

    applied: int = 0
    changes: dict[bytes, bytes | None] = field(default_factory=dict)

    def load(self, store: Store) -> None:
        raw = store.get(b"n")
        self.applied = int(raw) if raw else 0

    def apply(self, event: Record, offset: int) -> None:
        self.applied += 1
        self.changes[b"n"] = str(self.applied).encode()

    def drain_changes(self) -> dict[bytes, bytes | None]:
        out, self.changes = self.changes, {}
        return out


class Seeks:
    def seek(self, offset: int) -> None:
        self.at = offset


def end(n: int) -> tuple[tuple[str, bytes], ...]:
    return (("traceparent", b"00-x"), (COMMAND_END, str(n).encode()))


def test_the_last_recorded_position_of_a_batch_counts():
    assert recorded_command_end([FakeRecord(0), FakeRecord(1)]) is None  # an older writer: none
    assert recorded_command_end([FakeRecord(0, headers=end(3)), FakeRecord(1, headers=end(5)), FakeRecord(2)]) == 5


def projection(tmp_path) -> Projection:
    p = Projection("unused:9092", "t", Codec(), Counting(), Store(tmp_path / "db"), name="test")  # type: ignore[arg-type]
    p._reader = Seeks()  # type: ignore[assignment]
    return p


async def test_the_projection_learns_the_recorded_position_and_keeps_it_with_its_checkpoint(tmp_path):
    p = projection(tmp_path)
    assert p.command_end is None
    await p._apply_batch([FakeRecord(0, headers=end(4)), FakeRecord(1, headers=end(4))])  # type: ignore[list-item]
    assert (p.position, p.command_end) == (2, 4)
    await p._apply_batch([FakeRecord(2)])  # type: ignore[list-item]  # a batch without one keeps the last
    assert (p.position, p.command_end) == (3, 4)
    ckpt = p.store.checkpoint("t", 0)
    assert ckpt is not None and (ckpt.next_offset, ckpt.command_end) == (3, 4)
    # The processor advances over its own committed transaction with the position it recorded.
    p.advance(5, None, 9)
    p.store.close()

    again = projection(tmp_path)
    again.reset()  # what a restart (or a failed transaction) reloads
    assert (again.position, again.command_end, again.state.applied) == (5, 9, 3)  # type: ignore[attr-defined]
    again.store.close()


async def test_a_store_written_before_the_position_was_recorded_has_none(tmp_path):
    p = projection(tmp_path)
    await p._apply_batch([FakeRecord(0), FakeRecord(1)])  # type: ignore[list-item]
    assert (p.position, p.command_end) == (2, None)
    p.store.close()
    again = projection(tmp_path)
    again.reset()
    assert again.command_end is None
    again.store.close()
