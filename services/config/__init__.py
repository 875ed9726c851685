"""Config server: owns the cluster catalog (shards, databases, collections,
chunks with versions, zones, settings).  One active instance.

Reads:   <cluster>.config.commands   (from the CLI, routers, shards, balancer)
Writes:  <cluster>.config.events     (single writer; its offset is the ConfigTime)
         replies to each command's `reply-to` topic
         <cluster>.deadletter        (commands that do not parse)

- `versions.py`  version arithmetic (pure)
- `settings.py`  cluster / collection settings and their defaults
- `catalog.py`   the catalog as the fold of config.events
- `decide.py`    commands -> events (pure)
- `server.py`    the wiring: projection + command processor
"""
