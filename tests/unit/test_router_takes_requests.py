"""A router takes each batch of `router.requests` (commits past it) before running it, so no
operation runs twice (services/router/server.py, `serve`; docs/decisions/0005, amendment).

Simulated seed 847 (drop-database): an update stuck on a shard held the router's commits back
while it answered the inserts after it; killed, it left them to the next router, which ran them
again after a dropDatabase was acknowledged: the database came back with acknowledged inserts."""

from __future__ import annotations

import asyncio

import pytest

from libs.bus import BusError, TopicSpec
from libs.bus.memory import MemoryBus, MemoryMessage
from services.router.server import serve, taken


class _Listener:
    async def on_revoked(self, partitions) -> None:
        pass

    async def on_assigned(self, partitions) -> None:
        pass


def _message(offset: int, partition: int = 0) -> MemoryMessage:
    return MemoryMessage("r", partition, offset, None, b"op%d" % offset, (), 0)


def test_a_batch_is_taken_past_its_last_record_on_each_partition():
    batch = {0: [_message(3), _message(4)], 2: [_message(7, 2)], 1: []}
    assert taken(batch) == {0: 5, 2: 8}


def test_a_router_that_dies_with_an_operation_stuck_leaves_none_it_answered_to_the_next():
    """Op 0 never finishes (its shard is down); ops 1 and 2 are answered. The router dies (no
    graceful leave: its session lapses). The next router must run none of them again: op 0's
    client sends it again itself, under the same lsid and txnNumber."""

    async def main() -> None:
        bus = MemoryBus()
        await bus.create_topics([TopicSpec("r")])
        p = bus.producer(client_id="client")
        await p.start()
        for i in range(3):
            await (await p.send("r", b"op%d" % i))
        first = bus.member("routers", "r", client_id="r1", listener=_Listener(), session_timeout_ms=100)
        await first.start()
        answered: list[bytes] = []
        stuck = asyncio.Event()

        async def handle(rec) -> None:
            if rec.offset == 0:
                await stuck.wait()  # forever
            answered.append(rec.value)

        router = asyncio.ensure_future(serve(first, handle, take=True, name="r1"))
        while len(answered) < 2:
            await asyncio.sleep(0.01)
        router.cancel()  # kill -9: the member does not leave the group, its session lapses
        await asyncio.gather(router, return_exceptions=True)

        second = bus.member("routers", "r", client_id="r2", listener=_Listener(), session_timeout_ms=100)
        await second.start()
        again: list[bytes] = []
        for _ in range(30):  # past the first's session: the partition is the second's
            batch = await second.poll(timeout_s=0.02)
            again += [m.value for records in batch.values() for m in records]
        assert second.assignment() == {0}
        assert sorted(answered) == [b"op1", b"op2"]
        assert again == [], "operations the dead router took were run again"

    asyncio.run(main())


class _Source:
    """A group member whose first commit fails (a rebalance under way), then succeeds."""

    def __init__(self, batch: dict[int, list[MemoryMessage]], failures: int) -> None:
        self.batch, self.failures = batch, failures
        self.position: dict[int, int] = {}
        self.commits: list[dict[int, int]] = []
        self.polls = 0

    async def poll(self, *, max_records: int, timeout_s: float) -> dict[int, list[MemoryMessage]]:
        self.polls += 1
        await asyncio.sleep(0)
        out = {tp: [m for m in records if m.offset >= self.position.get(tp, 0)] for tp, records in self.batch.items()}
        out = {tp: records for tp, records in out.items() if records}
        for tp, records in out.items():
            self.position[tp] = records[-1].offset + 1
        return out

    def assignment(self) -> set[int]:
        return set(self.batch)

    async def commit(self, offsets: dict[int, int]) -> None:
        if self.failures:
            self.failures -= 1
            raise BusError("rebalance in progress")
        self.commits.append(dict(offsets))

    def seek(self, partition: int, offset: int) -> None:
        self.position[partition] = offset


async def _serve_until(source: _Source, handle, polls: int, then=None) -> None:
    """Serve `source` until it has been polled `polls` times (`then`: a change made halfway),
    then stop the router."""

    async def polled(n: int) -> None:
        while source.polls < n:
            await asyncio.sleep(0)

    serving = asyncio.ensure_future(serve(source, handle, take=True, name="r"))  # type: ignore[arg-type]
    if then is not None:
        await polled(polls // 2)
        then()
    await polled(polls)
    serving.cancel()
    await asyncio.gather(serving, return_exceptions=True)


def test_a_batch_whose_commit_fails_is_not_run_until_taken():
    async def main() -> None:
        source = _Source({0: [_message(0), _message(1)]}, failures=1)
        ran: list[tuple[int, list[dict[int, int]]]] = []

        async def handle(rec) -> None:
            ran.append((rec.offset, list(source.commits)))

        await _serve_until(source, handle, 5)
        # refused once: sought back and fetched again, then taken, then run, each once
        assert source.commits == [{0: 2}]
        assert ran == [(0, [{0: 2}]), (1, [{0: 2}])]

    asyncio.run(main())


def test_a_member_evicted_from_its_group_cannot_commit():
    """As Kafka's coordinator (CommitFailedError): a member frozen past its session must not
    take records that the partition's new owner reads too."""

    async def main() -> None:
        bus = MemoryBus()
        await bus.create_topics([TopicSpec("r")])
        p = bus.producer(client_id="client")
        await p.start()
        await (await p.send("r", b"op0"))
        a = bus.member("g", "r", client_id="a", listener=_Listener(), session_timeout_ms=50)
        await a.start()
        assert [m.value for m in (await a.poll(timeout_s=0.1))[0]] == [b"op0"]
        await asyncio.sleep(0.1)  # a is frozen past its session
        b = bus.member("g", "r", client_id="b", listener=_Listener(), session_timeout_ms=50)
        await b.start()
        assert [m.value for m in (await b.poll(timeout_s=0.1))[0]] == [b"op0"]
        with pytest.raises(BusError):
            await a.commit({0: 1})
        with pytest.raises(BusError):
            await b.commit({1: 1})  # not a partition it holds
        await b.commit({0: 1})
        assert await b.committed(0) == 1

    asyncio.run(main())


def _op(offset: int, kind: str) -> MemoryMessage:
    return MemoryMessage("r", 0, offset, None, b'{"type":"%s","v":1}' % kind.encode(), (), 0)


def test_reads_run_at_once_and_writes_only_once_their_batch_is_taken():
    """A find or a count may run twice unharmed: it does not wait for its batch's commit. A
    write, or a getMore (which moves a cursor), does; when the commit fails, no write runs and
    the batch is fetched again (its reads then answer twice)."""

    async def main() -> None:
        ops = [_op(0, "Find"), _op(1, "Insert"), _op(2, "Count"), _op(3, "GetMore"), _op(4, "Explain")]
        source = _Source({0: ops}, failures=1)
        ran: list[tuple[int, int]] = []  # (offset, commits made when it ran)

        async def handle(rec) -> None:
            ran.append((rec.offset, len(source.commits)))

        await _serve_until(source, handle, 5)
        assert source.commits == [{0: 5}]
        reads = [offset for offset, _ in ran if offset in (0, 2, 4)]
        assert sorted(reads) == [0, 0, 2, 2, 4, 4], ran  # before the failed commit, and again after it
        assert [(o, c) for o, c in ran if o in (1, 3)] == [(1, 1), (3, 1)], ran  # once, once taken

    asyncio.run(main())


def test_a_batch_of_reads_alone_is_taken_in_the_background_before_the_next_commit():
    async def main() -> None:
        source = _Source({0: [_op(0, "Find"), _op(1, "Count")]}, failures=0)
        ran: list[int] = []

        async def handle(rec) -> None:
            ran.append(rec.offset)

        await _serve_until(source, handle, 6, then=lambda: source.batch[0].append(_op(2, "Update")))
        assert ran == [0, 1, 2]
        assert source.commits == [{0: 2}, {0: 3}]  # in order: the reads' commit landed first

    asyncio.run(main())
