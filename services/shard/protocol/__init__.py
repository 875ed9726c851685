"""The shard's side of the migration protocol and of range deletion, as pure state machines.

One module per role: `donor` (the shard giving a range, or a database's unsharded
collections, away), `recipient` (the shard receiving it) and `range_deletion` (the
orphans either one deletes once the migration is decided).  Each names its states and
documents, per request, the state it expects and the state it leaves.

A transition is a function of the shard as it stands (`common.Shard`: its id, its view
of the catalog, its documents), the request, and whatever else it needs injected (the
time now, the queries still open): it returns a `common.Step` (the changelog events, the
reply, and the fault point the driver fires before the decision is committed) or raises
a CommandError.  No clock, no fault point, no Kafka inside: `services/shard/migrations.py`
is the driver that supplies them.
"""
