"""Balancer (one active instance): will run balancing rounds, defragmentation and
the auto-merger (issue 5).  Today: follows the catalog.

Reads:   <cluster>.config.events, shard statistics
Writes:  <cluster>.config.commands
"""
