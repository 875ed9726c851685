"""Router (any number of instances): will route client operations by shard key
(issue 3) from a routing-table cache projected from config.events.  Today: follows the catalog.

Reads:   <cluster>.router.requests, its own inbox, <cluster>.config.events
Writes:  <cluster>.shard.<id>.requests, replies to clients
"""
