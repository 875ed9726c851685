"""Records of `<cluster>.sessions`, the sessions store (docs/decisions/0015).

The topic is compacted and keyed by the lsid's id (its UUID as text), so it holds the latest
`Session` record of every session; a null value (a tombstone) ends one, and compaction then
drops it.  Routers write it from their logical session caches; shards read it to know which
sessions are live before they reap the records of expired ones.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from schemas import Codec, Record


class Session(Record):
    """A live session: its lsid and when a router last saw it used (epoch milliseconds)."""

    type: Literal["Session"] = "Session"
    v: Literal[1] = 1
    lsid: dict[str, Any]  # {"id": "<uuid>"}
    lastUse: int = Field(ge=0)


sessions: Codec[Session] = Codec("sessions", Session, (Session,))
