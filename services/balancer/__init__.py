"""Balancer (one active instance): balancing rounds (chunk selection by a pure
policy), the secondary loop (defragmentation, auto-merge), shard removal, and the
state that survives a restart in its own event log.

Reads:   <cluster>.config.events     (the catalog; the migration history for the auto-merger)
         <cluster>.shard.stats       (every shard's chunk sizes)
         <cluster>.balancer.commands (from the CLI and from its own loops; one consumer group)
         <cluster>.inbox.balancer    (replies to what it sends)
Writes:  <cluster>.config.commands   (splits, moveRange, merges, movePrimary, removeShard)
         <cluster>.shard.<id>.requests (SplitVector, DataSize)
         <cluster>.balancer.events   (actions in flight and their outcomes, rounds,
                                      defragmentation state; compacted)
         replies to each command's `reply-to`, <cluster>.deadletter

Policy (pure, no I/O):
  policy.py      chunk selection, a pure function of a snapshot (docs/reference/balancer.md)
  snapshot.py    the snapshot from the catalog and statistics
  defragment.py, automerge.py   defragmentation phases and the auto-merger's choices
  draining.py    the steps of removing a shard past its chunks
  state.py       the balancer's durable state (fold of balancer.events) and its decisions
Execution:
  server.py      hosting and status queries
  statistics.py  the statistics reader (shard.stats)
  history.py     the migration history (config.events), for the auto-merger's window
  rounds.py      the round loop: snapshot, plan, issue actions
  executor.py    runs one action by its type and records its structured outcome
  secondary.py   the secondary loop: defragmentation and auto-merge
"""
