"""Cluster and collection settings: every knob from docs/reference/settings.md, with MongoDB's defaults.

Settings are catalog state: changed by `SetSetting` commands, recorded as
`SettingChanged` events, so every service reads the same values at the same
ConfigTime.  Names follow MongoDB's where it has one.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

MB = 1024 * 1024
# H:MM or HH:MM, as MongoDB's docs write activeWindow ("8:00"); stored as HH:MM, which compares as text.
HHMM = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)\Z")  # \Z, not $: "$" also matches before a final newline


class Window(BaseModel):
    """The balancing window, e.g. 23:00–06:00 in Europe/Paris (may wrap midnight)."""

    model_config = ConfigDict(extra="forbid")
    start: str
    stop: str
    timeZone: str

    @field_validator("start", "stop")
    @classmethod
    def _hhmm(cls, v: str) -> str:
        if not (m := HHMM.match(v)):
            raise ValueError(f"{v!r} is not a time of day HH:MM")
        return f"{int(m[1]):02d}:{m[2]}"

    @field_validator("timeZone")
    @classmethod
    def _tz(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"unknown time zone {v!r} (use an IANA name such as 'UTC' or 'Europe/Paris')") from None
        return v


class ClusterSettings(BaseModel):
    # No inf/NaN: the event log is JSON, where pydantic writes them as null, which replays as
    # "reset to the default" — followers would disagree with the config server.
    model_config = ConfigDict(extra="forbid", validate_assignment=True, allow_inf_nan=False)

    # chunk size (MongoDB 6.0+: 128 MB; allowed 1..1024 MB)
    maxChunkSizeBytes: int = Field(128 * MB, ge=1 * MB, le=1024 * MB)
    # balancer on/off and its window (None: any time)
    balancerEnabled: bool = True
    balancerWindow: Window | None = None
    balancerRoundIntervalSecs: float = Field(10.0, gt=0)
    balancerMigrationsThrottlingMs: int = Field(1000, ge=0)
    # per-shard capacity weights: a weight-2 shard aims for twice the data of a weight-1 shard (default 1)
    shardWeights: dict[str, float] = Field(default_factory=dict)
    # range deletion after migrations
    orphanCleanupDelaySecs: int = Field(900, ge=0)
    rangeDeleterBatchSize: int = Field(128, ge=1)
    rangeDeleterBatchDelayMS: int = Field(20, ge=0)
    # chunk migration's bulk clone (docs/reference/chunk-migration.md): clone batches a donor has
    # unacknowledged at most; and whether it sends one small batch at a time while either shard
    # serves clients
    migrationCloneBatchesInFlight: int = Field(4, ge=1, le=64)
    migrationThrottleUnderLoad: bool = True
    # auto-merger and defragmentation
    autoMergerEnabled: bool = True
    autoMergerIntervalSecs: int = Field(3600, ge=1)
    autoMergerThrottlingMS: int = Field(15000, ge=0)
    chunkDefragmentationThrottlingMS: int = Field(0, ge=0)
    # history kept for snapshot reads; chunks migrated within it are not auto-merged
    minSnapshotHistoryWindowInSeconds: int = Field(300, ge=0)
    # signed cluster time (docs/decisions/0014): how long a signing key is valid (MongoDB's
    # 90 days), and how far ahead of the wall clock a gossiped time may be (one year)
    KeysRotationIntervalSec: int = Field(7_776_000, ge=1)
    maxAcceptableLogicalClockDriftSecs: int = Field(31_536_000, ge=0)
    # logical sessions (docs/decisions/0015): an idle session expires after the timeout (fractions
    # of a minute are allowed, so tests can use seconds); routers flush their session caches to the
    # sessions store, and shards reap expired sessions' records, every refresh period
    logicalSessionTimeoutMinutes: float = Field(30, gt=0)
    logicalSessionRefreshMillis: int = Field(300_000, ge=1)
    # multi-document transactions (docs/decisions/0020): a transaction still open this long after
    # its first statement on a shard is aborted there (its documents released)
    transactionLifetimeLimitSeconds: float = Field(60, gt=0)

    @field_validator("shardWeights")
    @classmethod
    def _weights(cls, v: dict[str, float]) -> dict[str, float]:
        bad = [s for s, w in v.items() if not w > 0]
        if bad:
            raise ValueError(f"weights must be positive numbers (shard(s) {', '.join(bad)})")
        return v


class CollectionSettings(BaseModel):
    """Per-collection overrides; None means "the cluster's"."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)
    maxChunkSizeBytes: int | None = Field(None, ge=1 * MB, le=1024 * MB)
    balancerEnabled: bool = True
    autoMergerEnabled: bool = True
    autoSplit: bool = False
    allowMigrations: bool = True


def validated(model: type[BaseModel], current: BaseModel, key: str, value: Any) -> BaseModel:
    """The settings with `key` set to `value` (None: back to the default); raises ValueError with a clear reason."""
    if key not in model.model_fields:
        known = ", ".join(model.model_fields)
        raise ValueError(f"unknown setting {key!r}; known: {known}")
    data = current.model_dump()
    if value is None:
        data.pop(key)
    else:
        data[key] = value
    try:
        return model.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        # The full location, e.g. "balancerWindow.timeZone: Field required", not just the key.
        where = ".".join(str(p) for p in err["loc"]) or key
        raise ValueError(f"{where}: {err['msg']}") from None


def in_window(window: Window | None, now: dt.datetime) -> bool:
    """Inside the balancing window: [start, stop) in its time zone, which may wrap midnight."""
    if window is None:
        return True
    local = now.astimezone(ZoneInfo(window.timeZone)).strftime("%H:%M")
    if window.start <= window.stop:
        return window.start <= local < window.stop
    return local >= window.start or local < window.stop
