"""Balancer (one active instance): balancing rounds (chunk selection by a pure
policy), and the state that survives a restart in its own event log.

Reads:   <cluster>.config.events, <cluster>.shard.stats, <cluster>.balancer.commands
Writes:  <cluster>.config.commands (splits, moveRange), <cluster>.balancer.events

policy.py      chunk selection (seed 002), a pure function of a snapshot
snapshot.py    the snapshot from the catalog and statistics
state.py       the balancer's durable state and decisions
server.py      hosting and the round loop
automerge.py, defragment.py, autosplit.py   pure logic for the auto-merger,
               defragmentation and auto-splitting
"""
