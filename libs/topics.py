"""Topic names of one cluster — the contract between services.

Every name carries the cluster prefix so several clusters (and every test)
can share a broker without seeing each other.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

CLUSTER_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")
SHARD_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}\Z")  # \Z, not $: "$" also matches before a final newline


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int = 1
    config: dict[str, str] = field(default_factory=dict)


KEEP_FOREVER = {"retention.ms": "-1", "retention.bytes": "-1"}
# Records that carry documents must fit a 16 MB BSON document as Extended JSON, up to 6x larger,
# plus its envelope (the broker's default is 1 MB): libs.kafka.MAX_RECORD_BYTES, 99 MiB.
MAX_RECORD_BYTES = 99 * 1024 * 1024
LARGE_RECORDS = {"max.message.bytes": str(MAX_RECORD_BYTES)}
ROUTER_PARTITIONS = 4  # at most this many routers share the client load
SHORT_LIVED = {
    "retention.ms": str(3600_000),
    **LARGE_RECORDS,
}  # replies and dead letters are for humans and waiting callers
# Per-second metric summaries: the dashboard keeps the last minute in its own tables.
METRICS_RETENTION = {"retention.ms": str(600_000)}


@dataclass(frozen=True)
class Topics:
    cluster: str

    def __post_init__(self) -> None:
        if not CLUSTER_NAME.match(self.cluster):
            raise ValueError(f"invalid cluster name {self.cluster!r}: use 1-64 of A-Z a-z 0-9 _ -")

    @property
    def config_commands(self) -> str:
        return f"{self.cluster}.config.commands"

    @property
    def config_events(self) -> str:
        """The catalog's change log; its offset is the cluster's ConfigTime."""
        return f"{self.cluster}.config.events"

    @property
    def dead_letters(self) -> str:
        return f"{self.cluster}.deadletter"

    @property
    def cli_replies(self) -> str:
        return f"{self.cluster}.cli.replies"

    @property
    def router_requests(self) -> str:
        """Client operations; routers share them through one consumer group."""
        return f"{self.cluster}.router.requests"

    @property
    def shard_stats(self) -> str:
        """Every shard's latest statistics for the balancer (compacted, keyed by shard id)."""
        return f"{self.cluster}.shard.stats"

    @property
    def metrics(self) -> str:
        """Every shard's and router's per-second metric summaries, keyed by source (schemas.metrics)."""
        return f"{self.cluster}.metrics"

    @property
    def balancer_commands(self) -> str:
        """Requests to the balancer (from the CLI and from its own round loop)."""
        return f"{self.cluster}.balancer.commands"

    @property
    def balancer_events(self) -> str:
        """The balancer's own log: actions in flight, defragmentation, rounds; replayed on restart."""
        return f"{self.cluster}.balancer.events"

    @property
    def sessions(self) -> str:
        """The sessions store: every live logical session and its last use (compacted, keyed by the
        lsid's id; a null value ends a session).  Routers write it, shards read it (decision 0015)."""
        return f"{self.cluster}.sessions"

    def for_balancer(self) -> list[TopicSpec]:
        # The events are keyed by entity (an action, a collection's defragmentation, ...), so
        # compaction keeps the log as small as the state it folds to.
        return [
            TopicSpec(self.balancer_commands, config=SHORT_LIVED),
            TopicSpec(self.balancer_events, config={"cleanup.policy": "compact", **LARGE_RECORDS}),
        ]

    def inbox(self, owner: str) -> str:
        """A per-instance inbox (replies to a router or a client, a router's cursor requests).
        Use the named inboxes below; this is their one spelling."""
        return f"{self.cluster}.inbox.{owner}"

    def router_inbox(self, instance: str) -> str:
        """Shard and config server replies to one router."""
        return self.inbox(f"router-{instance}")

    def router_cursors(self, instance: str) -> str:
        """getMore for the cursors one router holds (only that router can serve them)."""
        return self.inbox(f"router-{instance}-cursors")

    def donor_inbox(self, shard: str) -> str:
        """Replies to a shard's migration coordinator (from itself and from recipients)."""
        return self.inbox(f"shard-{shard}-migrations")

    def txn_coordinator_inbox(self, shard: str) -> str:
        """Replies to a shard's two-phase commit coordinators (participants' votes and acks)."""
        return self.inbox(f"shard-{shard}-txn-coordinator")

    def session_reaper_inbox(self, shard: str) -> str:
        """Replies to a shard's session reaper (ForgetSessions, sent to the shard itself)."""
        return self.inbox(f"shard-{shard}-sessions")

    @property
    def ddl_inbox(self) -> str:
        """Replies to the config server's DDL coordinators (from the shards and from itself)."""
        return self.inbox("config-ddl")

    @property
    def balancer_inbox(self) -> str:
        return self.inbox("balancer")

    @property
    def range_deleter_inbox(self) -> str:
        return self.inbox("range-deleter")

    @property
    def dashboard_inbox(self) -> str:
        """Replies to the dashboard's status queries (shards' ListMigrations, the balancer's state)."""
        return self.inbox("dashboard")

    def client_inbox(self, client: str) -> str:
        return self.inbox(f"client-{client}")

    def group(self, member: str) -> str:
        """The consumer group of a service's command partition (its transactional ids derive
        from it): `config`, `router`, `shard-<id>`, `balancer`."""
        return f"{self.cluster}.{member}"

    def shard_requests(self, shard: str) -> str:
        return f"{self.cluster}.shard.{shard}.requests"

    def shard_changelog(self, shard: str) -> str:
        return f"{self.cluster}.shard.{shard}.changelog"

    def core(self) -> list[TopicSpec]:
        """Topics a cluster needs before any service starts."""
        return [
            TopicSpec(self.config_commands, config=KEEP_FOREVER),
            TopicSpec(self.config_events, config=KEEP_FOREVER),
            TopicSpec(self.dead_letters, config=SHORT_LIVED),
            TopicSpec(self.cli_replies, config=SHORT_LIVED),
            TopicSpec(self.router_requests, partitions=ROUTER_PARTITIONS, config=SHORT_LIVED),
            TopicSpec(self.shard_stats, config={"cleanup.policy": "compact", **LARGE_RECORDS}),
            TopicSpec(self.sessions, config={"cleanup.policy": "compact"}),
            TopicSpec(self.metrics, config=METRICS_RETENTION),
        ]

    def for_shard(self, shard: str) -> list[TopicSpec]:
        return [
            TopicSpec(self.shard_requests(shard), config=SHORT_LIVED),
            TopicSpec(self.shard_changelog(shard), config={"cleanup.policy": "compact", **LARGE_RECORDS}),
        ]
