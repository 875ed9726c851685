"""Session fields and cluster times between the wire's BSON and the domain's Extended JSON.

The domain (docs/decisions/0014, 0015) reads an lsid as `{"id": "<uuid>"}` and times as
`{"$timestamp": {"t", "i"}}` with signatures as `{"$binary": ...}`, as the Kafka front's
records carry them; a driver sends a binary UUID, a BSON Timestamp and binary hash.  Values of
any other shape pass through unchanged, so the domain's parsers refuse them with MongoDB's
errors (TypeMismatch, ...).  Pure.
"""

from __future__ import annotations

import base64
import uuid
from typing import Any

from bson import Int64, Timestamp
from bson.binary import Binary

from domain import clock as vclock
from domain.protocol import ErrorCode
from libs.errors import CommandError


def wire_timestamp(raw: Any) -> Any:
    """A BSON Timestamp as the domain reads it (Extended JSON); anything else unchanged, for
    the domain's parsers to refuse with MongoDB's error."""
    if isinstance(raw, Timestamp):
        return {"$timestamp": {"t": raw.time, "i": raw.inc}}
    return raw


def wire_lsid(raw: Any) -> Any:
    """A driver's lsid (`{id: UUID}` as binary subtype 4) as the domain reads it: `{"id": "<uuid>"}`."""
    if not isinstance(raw, dict):
        return raw
    sid = raw.get("id")
    if isinstance(sid, uuid.UUID):
        return {**raw, "id": str(sid)}
    if isinstance(sid, Binary) and sid.subtype in (3, 4) and len(sid) == 16:
        return {**raw, "id": str(uuid.UUID(bytes=bytes(sid)))}
    return raw


def wire_cluster_time(raw: Any) -> Any:
    """A client's `$clusterTime` (Timestamp, binary hash, long keyId) in the domain's Extended JSON."""
    if not isinstance(raw, dict):
        return raw
    out = dict(raw)
    if "clusterTime" in out:
        out["clusterTime"] = wire_timestamp(out["clusterTime"])
    sig = out.get("signature")
    if isinstance(sig, dict):
        sig = dict(sig)
        proof = sig.get("hash")
        if isinstance(proof, bytes) and (not isinstance(proof, Binary) or proof.subtype == 0):
            sig["hash"] = {"$binary": {"base64": base64.b64encode(bytes(proof)).decode(), "subType": "00"}}
        if isinstance(sig.get("keyId"), int):
            sig["keyId"] = int(sig["keyId"])
        out["signature"] = sig
    return out


def reply_timestamp(packed: int) -> Timestamp:
    return Timestamp(packed >> 32, packed & 0xFFFFFFFF)


def reply_cluster_time(signed: dict[str, Any]) -> dict[str, Any]:
    """`routing.signed_cluster_time()` (Extended JSON) as a reply carries it in BSON."""
    ts = signed["clusterTime"]["$timestamp"]
    sig = signed["signature"]
    return {
        "clusterTime": Timestamp(ts["t"], ts["i"]),
        "signature": {
            "hash": Binary(base64.b64decode(sig["hash"]["$binary"]["base64"]), 0),
            "keyId": Int64(sig["keyId"]),
        },
    }


def wire_read_concern(raw: Any) -> Any:
    if isinstance(raw, dict):
        for name in ("afterClusterTime", "atClusterTime"):
            if name in raw:
                raw = {**raw, name: wire_timestamp(raw[name])}
    return raw


def pinned_read_concern(raw: Any, cluster_time: int) -> Any:
    """A command's read concern with a snapshot read's time chosen once (the router's
    `cluster_time` unless it names one), so that every find the command makes reads at the same
    time and its reply can name it (`atClusterTime`); anything else as `wire_read_concern`."""
    rc = wire_read_concern(raw)
    if isinstance(rc, dict) and rc.get("level") == "snapshot" and "atClusterTime" not in rc:
        if "afterClusterTime" in rc:  # a causal snapshot session: at our time, which is after it
            try:
                after = vclock.parse_after_cluster_time(rc)
            except CommandError:
                return rc  # the router refuses it with the reason
            if after is None or after > cluster_time:
                return rc  # a time nobody handed out: the router refuses it
            rc = {k: v for k, v in rc.items() if k != "afterClusterTime"}
        rc = {**rc, "atClusterTime": {"$timestamp": {"t": cluster_time >> 32, "i": cluster_time & 0xFFFFFFFF}}}
    return rc


def refuse_snapshot_of_config(ns: str, rc: Any) -> None:
    """The config database is the router's catalog projection as it is now, not as it was: a
    snapshot read of it is refused rather than answered with the latest state."""
    if ns.startswith("config.") and isinstance(rc, dict) and rc.get("level") == "snapshot":
        raise CommandError(
            ErrorCode.InvalidOptions, f'readConcern level "snapshot" is not supported on {ns} (the config database)'
        )


def snapshot_time(rc: Any) -> Timestamp | None:
    """The time a pinned snapshot read concern reads at, as a reply names it."""
    if isinstance(rc, dict) and rc.get("level") == "snapshot" and isinstance(rc.get("atClusterTime"), dict):
        t = rc["atClusterTime"].get("$timestamp", {})
        if isinstance(t, dict) and isinstance(t.get("t"), int) and isinstance(t.get("i"), int):
            return Timestamp(t["t"], t["i"])
    return None
