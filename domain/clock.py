"""The vector clock (docs/decisions/0014): ClusterTime, ConfigTime, TopologyTime.

- `LogicalTime(secs, inc)`: MongoDB's Timestamp.  Records and headers carry it packed into
  one int (`secs << 32 | inc`); clients see Extended JSON `{"$timestamp": {"t", "i"}}`.
- `VectorClock`: a node's three times.  Shards and the config server `tick` it once per
  event they write; everyone `advance`s it with what others gossip.  Routers never tick.
- Signed cluster times: HMAC-SHA1 over the packed time with a key the config server made
  (`ClusterTimeKeyCreated`), so a client cannot push a router's clock forward on its own.

Everything here is pure but `VectorClock`, whose state is three ints behind a lock (tick
and advance are a few comparisons: cheap enough for once per event).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from domain.protocol import ErrorCode
from libs.errors import CommandError
from libs.headers import VECTOR_TIME as VECTOR_TIME  # the header: "cluster,config,topology", packed, decimal

MAX_INC = 0xFFFFFFFF
HASH_BYTES = 20  # SHA-1
DUMMY_HASH = bytes(HASH_BYTES)  # MongoDB's signature before any key exists: keyId 0, zero hash


# ------------------------------------------------------------------ LogicalTime


@dataclass(frozen=True, order=True)
class LogicalTime:
    secs: int
    inc: int

    @property
    def packed(self) -> int:
        return self.secs << 32 | self.inc

    @classmethod
    def unpack(cls, packed: int) -> LogicalTime:
        return cls(packed >> 32, packed & MAX_INC)

    def to_ejson(self) -> dict[str, Any]:
        return {"$timestamp": {"t": self.secs, "i": self.inc}}

    def __str__(self) -> str:
        return f"Timestamp({self.secs}, {self.inc})"


def to_ejson(packed: int) -> dict[str, Any]:
    return LogicalTime.unpack(packed).to_ejson()


def parse_timestamp(raw: Any, what: str) -> int:
    """A packed time from Extended JSON `{"$timestamp": {"t": <secs>, "i": <inc>}}`; TypeMismatch
    for anything else (as MongoDB answers a field of the wrong BSON type)."""
    if isinstance(raw, dict) and set(raw) == {"$timestamp"} and isinstance(ts := raw["$timestamp"], dict):
        t, i = ts.get("t"), ts.get("i")
        if (
            set(ts) == {"t", "i"}
            and all(isinstance(v, int) and not isinstance(v, bool) for v in (t, i))
            and 0 <= t <= MAX_INC  # type: ignore[operator]
            and 0 <= i <= MAX_INC  # type: ignore[operator]
        ):
            return LogicalTime(t, i).packed  # type: ignore[arg-type]
    raise CommandError(
        ErrorCode.TypeMismatch,
        f'{what} must be a timestamp {{"$timestamp": {{"t": <seconds>, "i": <increment>}}}} '
        f"(32-bit unsigned each), not {_show(raw)}",
    )


def _show(raw: Any) -> str:
    text = repr(raw)
    return text if len(text) <= 80 else text[:77] + "..."


# ------------------------------------------------------------------ the vector


class VectorTime(NamedTuple):
    """Packed LogicalTimes; cluster >= config >= topology wherever a clock holds them."""

    cluster: int = 0
    config: int = 0
    topology: int = 0

    def header(self) -> bytes:
        return f"{self.cluster},{self.config},{self.topology}".encode()

    @classmethod
    def from_header(cls, raw: bytes | None) -> VectorTime | None:
        """The gossip header's times; None if absent or garbled (a garbled header advances nothing)."""
        if not raw:
            return None
        try:
            cluster, config, topology = (int(x) for x in raw.split(b","))
        except ValueError:
            return None
        if min(cluster, config, topology) < 0 or max(cluster, config, topology) >> 64:
            return None
        return cls(cluster, config, topology)


def _wall() -> float:
    return time.time()


class VectorClock:
    """A node's vector clock.  `tick` only on shards and the config server (once per event
    written); `advance` everywhere, with gossip.  Times only ever move forward."""

    def __init__(self, wall: Callable[[], float] | None = None) -> None:
        # time.time looked up at each call, not bound at import: the simulator replaces it.
        self.wall = wall if wall is not None else _wall
        self._lock = threading.Lock()  # the in-process test cluster reads clocks from other threads
        self._cluster = self._config = self._topology = 0

    def now(self) -> VectorTime:
        with self._lock:
            return VectorTime(self._cluster, self._config, self._topology)

    @property
    def cluster_time(self) -> int:
        return self._cluster

    def tick(self, wall: float | None = None) -> int:
        """The next ClusterTime: the wall clock's seconds if the clock is behind them, else one
        more increment (past MAX_INC, the next second)."""
        secs = int(self.wall() if wall is None else wall)
        with self._lock:
            cur = self._cluster
            if secs > cur >> 32:
                new = secs << 32 | 1
            elif cur & MAX_INC == MAX_INC:
                new = ((cur >> 32) + 1) << 32 | 1
            else:
                new = cur + 1
            self._cluster = new
            return new

    def advance(self, cluster: int = 0, config: int = 0, topology: int = 0) -> None:
        """Move forward to what was gossiped (never back); a later component lifts the earlier
        ones, so ClusterTime >= ConfigTime >= TopologyTime holds whatever the input."""
        with self._lock:
            if topology > self._topology:
                self._topology = topology
            if max(config, self._topology) > self._config:
                self._config = max(config, self._topology)
            if max(cluster, self._config) > self._cluster:
                self._cluster = max(cluster, self._config)

    # The gossip protocol libs' runtime speaks (libs.commands.Gossip): headers in and out.
    def gossip_out(self) -> bytes:
        return self.now().header()

    def gossip_in(self, raw: bytes | None) -> None:
        if (t := VectorTime.from_header(raw)) is not None:
            self.advance(*t)


# ------------------------------------------------------------------ signatures


@dataclass(frozen=True)
class ClusterTimeKey:
    """A signing key the config server made: valid to sign times before `expires_at` (packed)."""

    key_id: int
    key: bytes
    expires_at: int


def sign(key: bytes, t: int) -> bytes:
    """HMAC-SHA1 of the packed time (its 8 bytes, little-endian, as MongoDB's proof)."""
    return hmac.new(key, t.to_bytes(8, "little"), hashlib.sha1).digest()


def verify(key: bytes, t: int, proof: bytes) -> bool:
    return hmac.compare_digest(sign(key, t), proof)


def signing_key(keys: Mapping[int, ClusterTimeKey], t: int) -> ClusterTimeKey | None:
    """The key that signs time `t`: the first to expire after it (else the newest one)."""
    valid = [k for k in keys.values() if k.expires_at > t]
    if valid:
        return min(valid, key=lambda k: (k.expires_at, k.key_id))
    return max(keys.values(), key=lambda k: (k.expires_at, k.key_id), default=None)


def signed_cluster_time(t: int, keys: Mapping[int, ClusterTimeKey]) -> dict[str, Any]:
    """`$clusterTime` as a reply carries it; before any key exists, MongoDB's dummy signature."""
    key = signing_key(keys, t)
    proof, key_id = (sign(key.key, t), key.key_id) if key else (DUMMY_HASH, 0)
    return {
        "clusterTime": to_ejson(t),
        "signature": {
            "hash": {"$binary": {"base64": base64.b64encode(proof).decode(), "subType": "00"}},
            "keyId": key_id,
        },
    }


@dataclass(frozen=True)
class SignedTime:
    time: int
    key_id: int
    proof: bytes


def _field(obj: dict[str, Any], name: str, where: str) -> Any:
    if name not in obj:
        raise CommandError(ErrorCode.NoSuchKey, f"{where} has no field {name!r}")
    return obj[name]


def parse_signed_cluster_time(raw: Any) -> SignedTime:
    """A client's `$clusterTime`; MongoDB's errors for a malformed one: TypeMismatch for a field of
    the wrong type, NoSuchKey for a missing one, UnsupportedFormat for a hash that is not 20 bytes."""
    if not isinstance(raw, dict):
        raise CommandError(ErrorCode.TypeMismatch, f"$clusterTime must be an object, not {_show(raw)}")
    t = parse_timestamp(_field(raw, "clusterTime", "$clusterTime"), "$clusterTime.clusterTime")
    sig = _field(raw, "signature", "$clusterTime")
    if not isinstance(sig, dict):
        raise CommandError(ErrorCode.TypeMismatch, f"$clusterTime.signature must be an object, not {_show(sig)}")
    binary = _field(sig, "hash", "$clusterTime.signature")
    b64 = binary.get("$binary") if isinstance(binary, dict) and set(binary) == {"$binary"} else None
    if not (isinstance(b64, dict) and isinstance(b64.get("base64"), str) and b64.get("subType") in ("00", "0")):
        raise CommandError(
            ErrorCode.TypeMismatch,
            "$clusterTime.signature.hash must be binary data "
            f'{{"$binary": {{"base64": ..., "subType": "00"}}}}, not {_show(binary)}',
        )
    try:
        proof = base64.b64decode(b64["base64"], validate=True)
    except ValueError:
        raise CommandError(ErrorCode.TypeMismatch, "$clusterTime.signature.hash is not valid base64") from None
    if len(proof) != HASH_BYTES:
        raise CommandError(ErrorCode.UnsupportedFormat, f"Unsupported SHA1Hash hash length: {len(proof)}")
    key_id = _field(sig, "keyId", "$clusterTime.signature")
    if not isinstance(key_id, int) or isinstance(key_id, bool) or not 0 <= key_id < 1 << 63:
        raise CommandError(ErrorCode.TypeMismatch, f"$clusterTime.signature.keyId must be a long, not {_show(key_id)}")
    return SignedTime(t, key_id, proof)


def check_drift(t: int, wall: float, max_drift_secs: int) -> None:
    """A time further ahead of the wall clock than the drift limit would drag every clock it
    reaches there: refused (ClusterTimeFailsRateLimiter)."""
    limit = int(wall) + max_drift_secs
    if t >> 32 > limit:
        raise CommandError(
            ErrorCode.ClusterTimeFailsRateLimiter,
            f"New cluster time, {LogicalTime.unpack(t)}, is too far from this node's wall clock time, "
            f"{int(wall)} (maxAcceptableLogicalClockDriftSecs: {max_drift_secs})",
        )


def validate_cluster_time(
    signed: SignedTime, own: int, keys: Mapping[int, ClusterTimeKey], wall: float, max_drift_secs: int
) -> int:
    """The time a client's `$clusterTime` may advance a router's clock to.  Not above the
    router's own: accepted as it is (the router vouches for nothing new).  Above it: only within
    the drift limit and with a valid signature by a key the cluster made."""
    if signed.time <= own:
        return signed.time
    check_drift(signed.time, wall, max_drift_secs)
    key = keys.get(signed.key_id)
    if key is None:
        raise CommandError(
            ErrorCode.KeyNotFound,
            f"No keys found for HMAC that is valid for keyId {signed.key_id} (time {LogicalTime.unpack(signed.time)})",
        )
    if not verify(key.key, signed.time, signed.proof):
        raise CommandError(ErrorCode.TimeProofMismatch, f"Time proof mismatch for {LogicalTime.unpack(signed.time)}")
    return signed.time


# ------------------------------------------------------------------ readConcern


def parse_after_cluster_time(read_concern: Any) -> int | None:
    """`readConcern.afterClusterTime` (packed), None without one.  Only the fields a causally
    consistent session sends, and a snapshot read's, are understood (`level` "local"/"majority"
    is accepted, as our single writers make both mean the same)."""
    if read_concern is None:
        return None
    if not isinstance(read_concern, dict):
        raise CommandError(ErrorCode.TypeMismatch, f"readConcern must be an object, not {_show(read_concern)}")
    unknown = set(read_concern) - {"afterClusterTime", "atClusterTime", "level"}
    if unknown:
        raise CommandError(ErrorCode.InvalidOptions, f"unrecognized readConcern field(s): {', '.join(sorted(unknown))}")
    level = read_concern.get("level", "local")
    if level not in ("local", "majority", "snapshot"):
        raise CommandError(ErrorCode.InvalidOptions, f"readConcern level {_show(level)} is not supported here")
    if "atClusterTime" in read_concern:
        if level != "snapshot":
            raise CommandError(ErrorCode.InvalidOptions, "atClusterTime is only supported for snapshot read concern")
        if "afterClusterTime" in read_concern:
            raise CommandError(
                ErrorCode.InvalidOptions,
                "Specifying a timestamp for readConcern snapshot in a causally consistent session is not allowed",
            )
    if "afterClusterTime" not in read_concern:
        return None
    t = parse_timestamp(read_concern["afterClusterTime"], "readConcern.afterClusterTime")
    if t == 0:
        raise CommandError(ErrorCode.InvalidOptions, "afterClusterTime cannot be a null timestamp")
    return t


def parse_at_cluster_time(read_concern: Any) -> int | None:
    """A snapshot read's `readConcern.atClusterTime` (packed); None for any other read.  The
    rest of the read concern is checked as `parse_after_cluster_time` does."""
    parse_after_cluster_time(read_concern)
    if read_concern is None or read_concern.get("level") != "snapshot":
        return None
    if "atClusterTime" not in read_concern:  # a router picks the time of a snapshot read
        raise CommandError(ErrorCode.InvalidOptions, "a snapshot read reaching a shard must name its atClusterTime")
    t = parse_timestamp(read_concern["atClusterTime"], "readConcern.atClusterTime")
    if t == 0:
        raise CommandError(ErrorCode.InvalidOptions, "atClusterTime cannot be a null timestamp")
    return t


def check_after_cluster_time(t: int, cluster_time: int) -> None:
    """A time nobody has handed out yet (above this node's clock after gossip) is refused, as mongod does."""
    if t > cluster_time:
        raise CommandError(
            ErrorCode.InvalidOptions,
            "readConcern afterClusterTime value must not be greater than the current clusterTime. "
            f"Requested clusterTime: {LogicalTime.unpack(t)}; current clusterTime: {LogicalTime.unpack(cluster_time)}",
        )


# ------------------------------------------------------------------ key rotation


def keys_to_create(keys: Mapping[int, ClusterTimeKey], now: float, interval_secs: int) -> list[tuple[int, int]]:
    """(keyId, expiresAt) of the keys the config server must make so that one is valid now and
    the next already exists (MongoDB's KeysCollectionManager): each valid for `interval_secs`,
    the next expiring one interval after the current."""
    now_t = LogicalTime(int(now), 0).packed
    valid = sorted(k.expires_at for k in keys.values() if k.expires_at > now_t)
    next_id = max(keys, default=0) + 1
    out: list[tuple[int, int]] = []
    if not valid:
        valid = [LogicalTime(int(now) + interval_secs, 0).packed]
        out.append((next_id, valid[0]))
        next_id += 1
    if len(valid) < 2:
        out.append((next_id, LogicalTime((valid[0] >> 32) + interval_secs, 0).packed))
    return out


def check_chunk_history(ns: str, at: int, since: int) -> None:
    """A snapshot read at `at` of a collection whose routing history starts at `since`."""
    if at < since:
        raise CommandError(
            ErrorCode.StaleChunkHistory,
            f"Read timestamp {LogicalTime.unpack(at)} is older than the first available history "
            f"for {ns}'s chunks: {LogicalTime.unpack(since)}",
        )


def check_snapshot_floor(at: int, floor: int) -> None:
    """A read (or a transaction's statement or commit) at `at` of a namespace dropped or renamed,
    or whose database was dropped or moved its primary, at `floor` (the catalog's changed_at)."""
    if at < floor:
        raise CommandError(
            ErrorCode.SnapshotUnavailable,
            f"Unable to read from a snapshot due to pending collection catalog changes; please retry the "
            f"operation. Snapshot timestamp is {LogicalTime.unpack(at)}. Collection minimum is "
            f"{LogicalTime.unpack(floor)}",
        )


def check_history_kept(at: int, oldest: int) -> None:
    """A snapshot read at `at` of a shard whose kept history starts at `oldest` (decisions/0019)."""
    if at < oldest:
        raise CommandError(
            ErrorCode.SnapshotTooOld,
            f"Read timestamp {LogicalTime.unpack(at)} is older than the oldest available timestamp "
            f"{LogicalTime.unpack(oldest)}",
        )
