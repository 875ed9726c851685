"""Range deleter (one active instance): will execute ready range-deletion tasks
of every shard (issue 4).  Today: follows the catalog.

Reads:   <cluster>.shard.<id>.changelog (tasks), <cluster>.config.events
Writes:  <cluster>.shard.<id>.requests (deletion batches)
"""
