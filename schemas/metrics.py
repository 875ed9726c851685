"""Records of `metrics`: one compact summary per second of each shard's and router's work.

A summary counts the operations a service handled in its interval, by type and per
namespace, with their latency as a sparse log-scaled histogram (`libs.metrics.Histogram`:
bucket index -> count), so that summaries merge by adding counts and the p50/p99 of a
minute can be read from sixty of them.  At a shard the latency is the time to decide
(apply) one request; at a router, the client-seen time of one operation.  Read by the
dashboard's figures (`services/dashboard/figures.py`); records that do not parse are
dead-lettered there.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from schemas import Codec, Record


class OperationFigures(BaseModel):
    """Operations of one interval: how many of each type, and the latency histogram of all of them."""

    model_config = ConfigDict(extra="forbid", frozen=True)
    ops: dict[str, int] = Field(default_factory=dict)  # "insert", "find", ... -> count
    latency: dict[int, int] = Field(default_factory=dict)  # bucket index -> count (libs.metrics.Histogram)


class MetricSummary(Record):
    type: Literal["MetricSummary"] = "MetricSummary"
    v: Literal[1] = 1
    role: Literal["shard", "router"]
    name: str  # the shard id ("s0") or the router's name ("router-1a2b3c4d")
    start: float  # Unix seconds: the interval's start (also the record's Kafka timestamp)
    seconds: float = Field(gt=0)  # the interval's length
    total: OperationFigures  # every operation of the interval
    namespaces: dict[str, OperationFigures] = Field(default_factory=dict)  # those that name a namespace
    dropped: dict[str, int] = Field(default_factory=dict)  # since the service started: "summaries", "spans"


summaries: Codec[MetricSummary] = Codec("metrics", MetricSummary, (MetricSummary,))
