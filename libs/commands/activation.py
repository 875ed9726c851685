"""Taking the command partition over, and standing by (docs/reference/command-processor.md,
"Recovery").  Activation expects the partition assigned and paused; it fences every earlier owner
(init_transactions, which returns only once their transactions are complete), reads the group's
committed offset, catches the projection up to the changelog's last stable offset, and resumes
the commands after both recorded positions.  Standing by forgets everything a batch left
uncommitted and rewinds the projection to the store."""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING

from libs.commands.offsets import resume_at
from libs.commands.settings import TRANSACTION_RETRY_BACKOFF_MS

if TYPE_CHECKING:
    from libs.commands.processor import CommandProcessor

log = logging.getLogger(__name__)


async def activate(p: CommandProcessor) -> None:
    """Leaves `p` active, the commands resumed where the last committed transaction stopped."""
    t0 = time.monotonic()
    member = p.member
    member.pause(p.partition)  # nothing is fetched until the committed offset is known
    await _start_producers(p)
    t_fenced = time.monotonic()
    # Only now is the committed offset final (the fenced owner cannot commit any more).
    committed = await member.committed(p.partition)
    p.projection.rewind()  # a standby's state is its store at its position: rewind, don't reload
    t_committed = time.monotonic()
    at = await p.projection.catch_up()
    # And only now is the position recorded in the changelog final.
    recorded = p.projection.command_end
    start = resume_at(committed, recorded)
    member.seek(p.partition, start)
    if start != (committed or 0):  # the group learns it soon (lag monitoring)
        p.group.lags(start)
    member.resume(p.partition)
    done = time.monotonic()
    # Where a take-over's time goes (bench/bench_takeover.py reads it from the readiness file).
    p.last_activation = {
        "fenceS": round(t_fenced - t0, 4),
        "committedS": round(t_committed - t_fenced, 4),
        "catchUpS": round(done - t_committed, 4),
        "totalS": round(done - t0, 4),
        "sinceAssignedS": round(done - p.assigned_at, 4),
    }
    p.active.set()
    p.policy.on_role("active")
    log.info(
        "%s: active at ConfigTime %d, commands from offset %d (group's %s, changelog's %s); %s",
        p.name,
        at,
        start,
        committed,
        recorded,
        p.last_activation,
    )


async def _start_producers(p: CommandProcessor) -> None:
    """The transactional producer (its start fences every earlier owner), and the plain one for
    reads' replies.  linger 0: a phase's records are all queued before the sender runs (nothing
    awaits in between), so lingering only delays each phase of every transaction."""
    p._producer = p.bus.transactional_producer(
        p.transactional_id,
        client_id=p.name,
        batch_bytes=p.batch_bytes,
        retry_backoff_ms=TRANSACTION_RETRY_BACKOFF_MS,
    )
    await p._producer.start()
    if p.policy.plain_reads:
        p.reads.producer = p.bus.producer(client_id=f"{p.name}-reads")
        await p.reads.producer.start()


async def deactivate(p: CommandProcessor, why: str) -> None:
    """Leaves `p` standing by: producers stopped, nothing uncommitted remembered, the projection
    at its store's position."""
    was = p.active.is_set()
    p.active.clear()
    if was and p.group.behind is not None and p._producer is not None:
        # Answered reads' offsets, so that the next owner does not answer them again (to inboxes
        # that may be gone by then); a producer in a failed transaction cannot.
        try:
            await p.commit_group_offset()
        except Exception as e:
            log.info("%s: answered commands' offsets not committed (%s: %s)", p.name, type(e).__name__, e)
    await _stop_producers(p)
    # Uncommitted read offsets: the next owner answers those reads again; and decides the commands
    # fetched meanwhile (activation seeks to where the last commit left them).
    p.reads.forget()
    p.group.behind = None
    p.carried, p.carried_end = [], None
    p.uncommitted.clear()  # a failed batch has already reset the state from the store
    if was:
        # Events applied while active moved the store, not the projection's consumer: seek it to
        # the state's position so standby polling applies nothing twice.
        p.projection.rewind()
        p.policy.on_role("standby")
        log.info("%s: standing by (%s)", p.name, why)


async def _stop_producers(p: CommandProcessor) -> None:
    for producer in (p._producer, p.reads.producer):
        if producer is not None:
            try:
                await producer.stop()
            except Exception:  # a fenced producer may refuse to close cleanly
                pass
    p._producer, p.reads.producer = None, None
