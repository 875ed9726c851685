"""The catalog's side of secondary indexes (docs/reference/indexes.md): which indexes a
collection lists, what a createIndexes adds to them and what a dropIndexes takes away, as
MongoDB decides it.  Pure: the config server's decisions (services/config/decide.py), the
routers' wire commands and the CLI (domain/sharding_commands.py) all use it.

**Listed indexes.**  Every collection lists `_id_`; a sharded one lists its shard key's index
too (named as MongoDB names it, `x_1` or `x_hashed`; unique when the collection was sharded
unique), unless the shard key is `{_id: 1}`.  Both are implicit: the documents' own keys serve
them, so no shard stores entries for them and no DDL builds or drops them.  The others are the
catalog's (IndexesCreated / IndexesDropped), in the order they were created.

**createIndexes** (`plan_create`): each requested spec is checked against those listed and
those before it in the request: the same index again is skipped ("all indexes already exist"),
a conflict is MongoDB's error (domain.indexes.check_new), a unique index of a sharded
collection needs the shard key as its prefix (CannotCreateIndex 67).

**dropIndexes** (`plan_drop`): "*" drops every index the catalog holds (never the implicit
ones); a name, a key pattern or a list of names drop those.  `_id_` is InvalidOptions (72),
the shard key's index CannotDropShardKeyIndex (370), a missing one IndexNotFound (27), a key
pattern that two indexes have AmbiguousIndexKeyPattern (181).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any, cast

from domain.indexes import ID_INDEX, ID_INDEX_NAME, IndexSpec, check_new, check_unique_with_shard_key
from domain.protocol import ErrorCode
from domain.shardkey import shell_form
from libs.errors import CommandError

ALL = "*"
ALREADY_EXIST = "all indexes already exist"
DROPPED_ALL = "non-_id indexes dropped for collection"


def shard_key_index(shard_key: Mapping[str, Any] | None, unique: bool = False) -> IndexSpec | None:
    """The implicit index of a sharded collection's key (None: unsharded, or keyed on _id)."""
    if shard_key is None or dict(shard_key) == {"_id": 1}:
        return None
    key = tuple((f, v if v == "hashed" else (1 if v > 0 else -1)) for f, v in shard_key.items())
    name = "_".join(f"{f}_{v}" for f, v in key)
    return IndexSpec.make(name, cast(tuple[tuple[str, int], ...], key), unique=unique)


def listed_indexes(
    stored: Sequence[IndexSpec], shard_key: Mapping[str, Any] | None = None, unique: bool = False
) -> list[IndexSpec]:
    """What listIndexes shows: `_id_`, the shard key's index (unless a created index has its key:
    that one serves, as when an unsharded collection is sharded on an indexed field), then the
    catalog's."""
    out = [ID_INDEX]
    if (sk := shard_key_index(shard_key, unique)) is not None and all(s.key != sk.key for s in stored):
        out.append(sk)
    return out + list(stored)


def implicit(spec: IndexSpec, shard_key: Mapping[str, Any] | None, unique: bool = False) -> bool:
    return spec.name == ID_INDEX_NAME or spec == shard_key_index(shard_key, unique)


def serves_shard_key(spec: IndexSpec, shard_key: Mapping[str, Any] | None) -> bool:
    sk = shard_key_index(shard_key)
    return sk is not None and spec.key == sk.key


def plan_create(
    listed: Sequence[IndexSpec], specs: Sequence[IndexSpec], shard_key: Mapping[str, Any] | None
) -> list[IndexSpec]:
    """The indexes of `specs` to build: those not listed yet (in request order, each once).
    CommandError as MongoDB for a conflict or a unique index without the shard key prefix;
    nothing is built then."""
    seen = list(listed)
    new: list[IndexSpec] = []
    for spec in specs:
        check_unique_with_shard_key(spec, shard_key)
        if spec.key == ID_INDEX.key and not spec.sparse and spec.partial is None:
            continue  # the _id index, whatever it is called here (MongoDB: "all indexes already exist")
        if check_new(seen, spec):
            continue
        seen.append(spec)
        new.append(spec)
    return new


def check_drop_target(index: Any) -> Any:
    """dropIndexes' `index` argument, checked for its shape: "*", a name, a key pattern (a
    non-empty object) or a non-empty list of names (no "*" among them)."""
    if isinstance(index, str):
        if not index:
            raise CommandError(ErrorCode.IndexNotFound, "index not found with name []")
        return index
    if isinstance(index, dict):
        if not index:
            raise CommandError(ErrorCode.IndexNotFound, "can't find index with key: {}")
        return dict(index)
    if isinstance(index, list) and index and all(isinstance(n, str) for n in index):
        if ALL in index:
            raise CommandError(ErrorCode.BadValue, "'*' cannot be one of the index names of an array")
        return list(index)
    raise CommandError(
        ErrorCode.TypeMismatch,
        "dropIndexes 'index' must be \"*\", an index name, a key pattern or an array of index names, "
        f"not {shell_form(index)}",
    )


def _droppable(spec: IndexSpec, ns: str, shard_key: Mapping[str, Any] | None, unique: bool) -> str:
    if spec.name == ID_INDEX_NAME:
        raise CommandError(ErrorCode.InvalidOptions, "cannot drop _id index")
    if serves_shard_key(spec, shard_key):
        raise CommandError(
            ErrorCode.CannotDropShardKeyIndex,
            f"Cannot drop the only compatible index for this collection's shard key ({ns}: {spec.name})",
        )
    return spec.name


def plan_drop(
    ns: str, listed: Sequence[IndexSpec], target: Any, shard_key: Mapping[str, Any] | None, unique: bool = False
) -> list[str]:
    """The names `target` (checked by check_drop_target) drops from the listed indexes."""
    if target == ALL:
        return [s.name for s in listed if s.name != ID_INDEX_NAME and not serves_shard_key(s, shard_key)]
    by_name = {s.name: s for s in listed}
    if isinstance(target, dict):
        key = tuple((f, v if isinstance(v, str) else (1 if v > 0 else -1)) for f, v in target.items())
        matches = [s for s in listed if s.key == key]
        if not matches:
            raise CommandError(ErrorCode.IndexNotFound, f"can't find index with key: {shell_form(target)}")
        if len(matches) > 1:
            raise CommandError(
                ErrorCode.AmbiguousIndexKeyPattern,
                f"{len(matches)} indexes found for key: {shell_form(target)}, identify by name instead. "
                f"Conflicting indexes: {', '.join(s.name for s in matches)}",
            )
        return [_droppable(matches[0], ns, shard_key, unique)]
    names = [target] if isinstance(target, str) else list(target)
    out: list[str] = []
    for name in names:
        if name not in by_name:
            raise CommandError(ErrorCode.IndexNotFound, f"index not found with name [{name}]")
        if (n := _droppable(by_name[name], ns, shard_key, unique)) not in out:
            out.append(n)
    return out


def create_reply(result: Mapping[str, Any], started: Mapping[str, Any]) -> dict[str, Any]:
    """mongos's createIndexes reply: per-shard `raw` with the counts, and the counts on top
    (what pymongo and mongosh read); `note` when nothing was to build."""
    before = int(result.get("numIndexesBefore", started.get("numIndexesBefore", 1)))
    after = int(result.get("numIndexesAfter", before))
    per_shard: dict[str, Any] = {
        "createdCollectionAutomatically": bool(started.get("createdCollectionAutomatically")),
        "numIndexesBefore": before,
        "numIndexesAfter": after,
    }
    if after == before:
        per_shard["note"] = ALREADY_EXIST
    per_shard["ok"] = 1
    shards = result.get("shards") or started.get("shards") or []
    return {"raw": {s: dict(per_shard) for s in shards}, **{k: v for k, v in per_shard.items() if k != "ok"}}


def drop_reply(result: Mapping[str, Any], target: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"nIndexesWas": int(result.get("nIndexesWas", 1))}
    if target == ALL:
        out["msg"] = DROPPED_ALL
    return out


def list_documents(listed: Sequence[IndexSpec]) -> list[dict[str, Any]]:
    """listIndexes' documents (`{"v": 2, "key": ..., "name": ..., ...}`)."""
    return [s.to_mongo() for s in listed]


# ------------------------------------------------------------------ following the shards' builds

INDEX_BUILD_POLL_ENV = "SHARDLOG_INDEX_BUILD_POLL_S"
INDEX_BUILD_POLL_S = 0.2


def index_build_poll() -> float:
    """How often a createIndexes coordinator (and `shardlog index create`) asks a shard how its
    build goes: SHARDLOG_INDEX_BUILD_POLL_S seconds (default 0.2; not a positive number: the
    default)."""
    raw = os.environ.get(INDEX_BUILD_POLL_ENV, "")
    try:
        value = float(raw) if raw else INDEX_BUILD_POLL_S
    except ValueError:
        return INDEX_BUILD_POLL_S
    return value if value > 0 else INDEX_BUILD_POLL_S


INDEX_BUILD_TIMEOUT_ENV = "SHARDLOG_INDEX_BUILD_TIMEOUT_S"
INDEX_BUILD_TIMEOUT_S = 3600.0


def index_build_timeout() -> float:
    """How long a createIndexes from a client (wire without maxTimeMS, CLI) waits for the build:
    SHARDLOG_INDEX_BUILD_TIMEOUT_S seconds (default 3600).  Past it the client gets
    ExceededTimeLimit and the build goes on (`shardlog ddl status`)."""
    raw = os.environ.get(INDEX_BUILD_TIMEOUT_ENV, "")
    try:
        value = float(raw) if raw else INDEX_BUILD_TIMEOUT_S
    except ValueError:
        return INDEX_BUILD_TIMEOUT_S
    return value if value > 0 else INDEX_BUILD_TIMEOUT_S


def index_name(item: Mapping[str, Any]) -> str | None:
    """The name of one entry of a shard's ListIndexes answer: an IndexRecorded-shaped entry
    (`{"spec": {...}, "state": ...}`) or a listIndexes document with a `state`."""
    spec = item.get("spec")
    name = spec.get("name") if isinstance(spec, Mapping) else item.get("name")
    return name if isinstance(name, str) else None


def build_states(listed: Mapping[str, Any], names: Sequence[str]) -> dict[str, dict[str, Any]]:
    """`names`' state on one shard from its ListIndexes answer (`{"indexes": [...]}`):
    {name: {"state": building|ready|failed, "scanned", "total", "error"}}.  One the shard does
    not list yet is building (its BuildIndexes was answered, the record may still be on its way);
    an entry without a state is ready (the implicit ones)."""
    by_name = {index_name(i): i for i in listed.get("indexes") or [] if isinstance(i, Mapping)}
    out: dict[str, dict[str, Any]] = {}
    for name in names:
        item = by_name.get(name)
        if item is None:
            out[name] = {"state": "building", "scanned": 0, "total": 0}
            continue
        state = {
            "state": item.get("state") or "ready",
            "scanned": item.get("scanned", 0),
            "total": item.get("total", 0),
        }
        if item.get("error"):
            state["error"] = item["error"]
        out[name] = state
    return out
