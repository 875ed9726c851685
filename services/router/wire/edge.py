"""What the wire command handlers reach the cluster through: the router's own parts, shared
with its Kafka front (`services/router/server.py`).  A wire operation calls
`routing.handle(...)` directly, so it saves the two Kafka hops of a Kafka client (client ->
`router.requests` -> router, router -> the client's inbox); from the router on, the path is
the same: shards and the config server are reached through Kafka only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from domain.clock import VectorClock
    from domain.follower import CatalogFollower
    from libs.requests import Requester
    from libs.service import ServiceSettings
    from services.router.route import OperationRouter
    from services.router.sessions import LogicalSessionCache


@dataclass
class RouterEdge:
    settings: ServiceSettings
    instance: str  # the router's instance name (config.mongos, serverStatus)
    routing: OperationRouter  # handle(record) -> result dict; raises CommandError
    follower: CatalogFollower  # the catalog projection: config database, listDatabases, ...
    requester: Requester  # requests to the config server (admin commands) and shards
    sessions: LogicalSessionCache
    clock: VectorClock
    started: float  # time.time() at start (serverStatus uptime, config.mongos)

    def stats(self) -> dict[str, Any]:
        """Counters for serverStatus (filled by the handlers that own them)."""
        return {}
