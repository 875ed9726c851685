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
    from services.router.wire.server import WireServer


# serverStatus.connections.available: mongos's default maxIncomingConnections (no limit of
# our own is enforced: asyncio holds them; the operating system's file limit is the bound).
MAX_INCOMING_CONNECTIONS = 1_000_000


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
    server: WireServer | None = None  # the wire server serving this edge (it sets itself here)

    def stats(self) -> dict[str, Any]:
        """Counters for serverStatus: the wire server's connections."""
        if self.server is None:
            return {"connections": {"current": 0, "available": 0, "totalCreated": 0}}
        current = self.server.open_connections
        return {
            "connections": {
                "current": current,
                "available": max(MAX_INCOMING_CONNECTIONS - current, 0),
                "totalCreated": self.server.connections_opened,
            }
        }
