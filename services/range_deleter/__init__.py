"""Range deleter (one instance; a second is harmless, as every batch is idempotent):
deletes the orphans of every shard's ready range-deletion tasks, batch by batch.

Reads:   its inbox <cluster>.inbox.range-deleter (shards' replies), <cluster>.config.events
Writes:  <cluster>.shard.<id>.requests (ListMigrations, DeleteRangeBatch)

- `deleter.py`  the policy, pure: which task next, why the others wait (shared with the CLI)
- `server.py`   the service: poll the shards, delete in batches
"""
