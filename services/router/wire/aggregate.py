"""aggregate over the wire: the pipeline is split as mongos splits it: what can run on the
shards ($match first, as a find filter) is pushed down, the rest runs on the router over the
merged stream (`domain/aggregation.py`, pure)."""

from __future__ import annotations
