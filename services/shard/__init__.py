"""Shard (one process per shard id): will own its documents, migration registry
and range-deletion tasks (issues 3 and 4).  Today: follows the catalog.

Reads:   <cluster>.shard.<id>.requests, <cluster>.config.events
Writes:  <cluster>.shard.<id>.changelog
"""
