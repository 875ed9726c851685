"""Named fault points, for crash tests: `SHARDLOG_FAULTS="point=action,..."`.

Actions: `kill` (SIGKILL this process, as `kill -9` would), `stop` (SIGSTOP:
the process freezes and becomes a zombie once others take over), `raise`.
A point with an `@text` suffix fires only when the caller's tag contains
that text, e.g. `config.before_commit@zombie-shard=stop`.
"""

from __future__ import annotations

import os
import signal


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


def fault_point(point: str, tag: str | None = None) -> None:
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
