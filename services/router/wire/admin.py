"""Sharding administration as mongos offers it (addShard, shardCollection, moveRange, the
balancer and zone commands, ...): each maps to the config command the CLI sends, through the
one implementation both share."""

from __future__ import annotations
