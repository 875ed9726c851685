"""Named fault points, for crash tests: `SHARDLOG_FAULTS="point=action,..."`.

Actions: `kill` (SIGKILL this process, as `kill -9` would), `stop` (SIGSTOP:
the process freezes and becomes a zombie once others take over), `raise`.
A point with an `@text` suffix fires only when the caller's tag contains
that text, e.g. `config.before_commit@zombie-shard=stop`.

The simulator (tests/sim) sets a hook instead: called at every point, it may crash the
simulated process there.

Known bugs (`KNOWN_BUGS`): past bugs and mutations kept behind switches, so the simulator and
the benches can show they would be found; `reintroduce` (the simulator) or
`SHARDLOG_BUGS="name,..."` (a service process: bench/bench_txn_faults.py --bug) turns them on.
Tests and benches only.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable


class FaultInjected(RuntimeError):
    pass


def _plan() -> dict[str, str]:
    spec = os.environ.get("SHARDLOG_FAULTS", "")
    out = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        point, _, action = item.partition("=")
        out[point] = action or "kill"
    return out


_PLAN = _plan()
_hook: Callable[[str, str | None], None] | None = None


def set_hook(hook: Callable[[str, str | None], None] | None) -> None:
    """Call `hook(point, tag)` at every fault point from now on (None: stop)."""
    global _hook
    _hook = hook


# Past bugs the simulator must find, put back behind a switch each (test-only: nothing sets one
# outside tests/sim). Each name says what the buggy code did.
KNOWN_BUGS = {
    "migration-forgets-sessions": "a migration moves documents but not the retryable writes' records, "
    "so a write retried after its range moved is applied again",
    "migration-without-catch-up": "the donor commits after the clone without sending the writes made "
    "during it (its catch-up), so the recipient never has them",
    "range-deletion-deletes-owned": "a range migrates back to a shard that still has its orphans to "
    "delete (the recipient does not wait), and the deletion then deletes what the shard owns again",
    "txn-first-writer-does-not-win": "a transaction's write meets a document written after its snapshot, "
    "or held by another open transaction, without a WriteConflict: its commit overwrites the other write",
    "txn-reads-past-prepare": "a read meets a prepared transaction's documents without waiting for its "
    "decision: it misses writes that commit at a time before its own",
}
_reintroduced: set[str] = set()


def _from_environment() -> set[str]:
    """`SHARDLOG_BUGS="name,..."`: known bugs a test or bench switches on in a service process."""
    named = {b for b in os.environ.get("SHARDLOG_BUGS", "").split(",") if b}
    if unknown := named - KNOWN_BUGS.keys():
        raise ValueError(f"SHARDLOG_BUGS names unknown bugs {sorted(unknown)}: {sorted(KNOWN_BUGS)}")
    return named


def reintroduce(bugs: set[str]) -> None:
    """Switch these known bugs on (the empty set: all off). Tests only."""
    unknown = bugs - KNOWN_BUGS.keys()
    if unknown:
        raise ValueError(f"unknown bugs {sorted(unknown)}: {sorted(KNOWN_BUGS)}")
    _reintroduced.clear()
    _reintroduced.update(bugs)


_reintroduced.update(_from_environment())


def reintroduced(bug: str) -> bool:
    return bug in _reintroduced


def fault_point(point: str, tag: str | None = None) -> None:
    if _hook is not None:
        _hook(point, tag)
    if not _PLAN:
        return
    action = _PLAN.get(point)
    if action is None and tag is not None:
        action = next((a for p, a in _PLAN.items() if p.startswith(point + "@") and p[len(point) + 1 :] in tag), None)
    if action is None:
        return
    if action == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif action == "stop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif action == "raise":
        raise FaultInjected(point)
