"""The executor of a shard's query plans (domain/planner.py), pure over a small protocol: the
shard's ``Documents.scan_index`` / ``get_by_id`` and a COLLSCAN the caller supplies (the shard's
owned, targeted ranges).  ``MemoryDocuments`` implements the protocol in memory, for tests.

Stages, innermost first (MongoDB's): IXSCAN (the plan's byte ranges, forward or backward; each
key's values re-checked against every field's bounds, so a key outside them costs no fetch),
FETCH (``get_by_id``) or, for a covered plan, the document rebuilt from the key (a null key
value may be a missing field: that key's document is fetched), the full filter re-checked,
the ownership filter (orphans stay invisible), duplicates of a multikey index dropped by
``_id``, then SORT only when the index does not give the order, SKIP/LIMIT, PROJECTION.
``ExecStats`` counts keysExamined, docsExamined and nReturned as the stream is read.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from domain.indexes import IndexSpec, entries
from domain.planner import FULL, Interval, Plan
from domain.query import apply_projection, sort_key
from domain.shardkey import encode_value

__all__ = ["Access", "ExecStats", "IndexedDocuments", "MemoryDocuments", "matching", "run"]

Entry = tuple[bytes, tuple[Any, ...], Any]  # (entry key, key values, _id)


class IndexedDocuments(Protocol):
    """What the executor reads of a shard's documents (services/shard/documents.py)."""

    def scan_index(self, ns: str, name: str, lo: bytes, hi: bytes, reverse: bool = False) -> Iterator[Entry]: ...

    def get_by_id(self, ns: str, _id: Any) -> dict[str, Any] | None: ...


@dataclass
class ExecStats:
    keysExamined: int = 0
    docsExamined: int = 0
    nReturned: int = 0

    def as_dict(self) -> dict[str, int]:
        return {"keysExamined": self.keysExamined, "docsExamined": self.docsExamined, "nReturned": self.nReturned}


def _everything(_: bytes) -> bool:
    return True


def _nowhere(_: dict[str, Any]) -> bytes:
    return b""


@dataclass
class Access:
    """How a plan reaches one collection's documents on this shard.

    `collscan`: (location, document) of the documents a COLLSCAN (or the clustered shard-key
    index) reads, in order; `location`: a fetched document's location (its shard key);
    `owned`: the ownership filter over locations; `locate`: a document's location by `_id`
    without reading it (a covered plan's ownership check), None when every document is owned
    (unsharded)."""

    documents: IndexedDocuments
    ns: str
    collscan: Callable[[], Iterable[tuple[bytes, dict[str, Any]]]]
    location: Callable[[dict[str, Any]], bytes] = _nowhere
    owned: Callable[[bytes], bool] = _everything
    locate: Callable[[Any], bytes | None] | None = None


def _set_path(doc: dict[str, Any], path: str, value: Any) -> None:
    parts = path.split(".")
    node = doc
    for p in parts[:-1]:
        node = node.setdefault(p, {})
    node[parts[-1]] = value


def _within(v: Any, ivs: tuple[Interval, ...]) -> bool:
    if ivs == (FULL,):
        return True
    enc = encode_value(v)
    return any(iv.contains_encoded(enc) for iv in ivs)


def matching(plan: Plan, access: Access, stats: ExecStats | None = None) -> Iterator[tuple[bytes, dict[str, Any]]]:
    """(location, document) of every owned document the plan's filter matches, each once, in
    the index's order (COLLSCAN: the collscan's).  A covered plan yields documents rebuilt from
    the keys, holding only the fields the query reads."""
    stats = stats if stats is not None else ExecStats()
    matcher = plan.matcher
    cand = plan.winner
    if cand is None or cand.index.clustered:
        for where, found in access.collscan():
            stats.docsExamined += 1
            if cand is not None:
                stats.keysExamined += 1
            if matcher.matches(found) and access.owned(where):
                yield where, found
        return
    spec = cand.index.spec
    bounds = cand.bounds
    check_keys = any(b != (FULL,) for b in bounds)
    reverse = cand.direction < 0
    seen: set[bytes] | None = set() if cand.index.multikey else None
    needed = plan.needed_paths if cand.covered else None
    position = {p: i for i, p in enumerate(spec.paths)}
    for lo, hi in reversed(plan.ranges) if reverse else plan.ranges:
        for _, key, _id in access.documents.scan_index(access.ns, spec.name, lo, hi, reverse):
            stats.keysExamined += 1
            if check_keys and not all(any(iv.contains(v) for iv in ivs) for v, ivs in zip(key, bounds, strict=True)):
                continue
            if seen is not None:
                id_enc = encode_value(_id)
                if id_enc in seen:
                    continue
                seen.add(id_enc)
            loc: bytes | None
            if needed is not None and all(key[position[p]] is not None for p in needed):
                rebuilt: dict[str, Any] = {"_id": _id}
                for p in needed:
                    _set_path(rebuilt, p, key[position[p]])
                if not matcher.matches(rebuilt):
                    continue
                doc: dict[str, Any] | None = rebuilt
                loc = access.locate(_id) if access.locate is not None else b""
            else:
                doc = access.documents.get_by_id(access.ns, _id)
                stats.docsExamined += 1
                if doc is None or not matcher.matches(doc):
                    continue
                loc = access.location(doc)
            if loc is None or doc is None or not access.owned(loc):
                continue
            yield loc, doc


def run(
    plan: Plan,
    access: Access,
    *,
    skip: int = 0,
    limit: int = 0,
    stats: ExecStats | None = None,
) -> Iterator[dict[str, Any]]:
    """The query's result: matching, then SORT (only if the index does not give the order),
    SKIP, LIMIT (0: none), PROJECTION.  Lazy: a limit stops the scan."""
    stats = stats if stats is not None else ExecStats()
    docs: Iterator[dict[str, Any]] = (d for _, d in matching(plan, access, stats))
    if plan.sort and not plan.sort_provided:
        docs = iter(sorted(docs, key=sort_key(dict(plan.sort))))
    docs = itertools.islice(docs, skip, skip + limit if limit else None)
    if plan.projection:
        projection = dict(plan.projection)
        docs = (apply_projection(d, projection) for d in docs)
    for d in docs:
        stats.nReturned += 1
        yield d


# ------------------------------------------------------------------------------ in memory


@dataclass
class MemoryDocuments:
    """A collection's documents and the entries of its indexes, in memory, with the shard's
    read API (`scan_index`, `get_by_id`): what the executor's tests run against."""

    specs: Sequence[IndexSpec] = ()
    docs: dict[bytes, dict[str, Any]] = field(default_factory=dict)  # by encoded _id
    order: list[bytes] = field(default_factory=list)  # insertion order (a COLLSCAN's)
    _entries: dict[str, list[Entry]] = field(default_factory=dict)
    multikey: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def of(cls, docs: Iterable[Mapping[str, Any]], specs: Sequence[IndexSpec] = ()) -> MemoryDocuments:
        out = cls(list(specs))
        for d in docs:
            out.insert(dict(d))
        return out

    def insert(self, doc: dict[str, Any]) -> None:
        id_enc = encode_value(doc["_id"])
        assert id_enc not in self.docs, "one document per _id"
        self.docs[id_enc] = doc
        self.order.append(id_enc)
        for spec in self.specs:
            keyed, multi = entries(spec, doc)
            rows = self._entries.setdefault(spec.name, [])
            for k, values in keyed.items():
                bisect.insort(rows, (k, values, doc["_id"]), key=lambda e: e[0])
            self.multikey[spec.name] = self.multikey.get(spec.name, False) or multi

    def scan_index(self, ns: str, name: str, lo: bytes, hi: bytes, reverse: bool = False) -> Iterator[Entry]:
        rows = self._entries.get(name, [])
        keys = [e[0] for e in rows]
        i, j = bisect.bisect_left(keys, lo), bisect.bisect_left(keys, hi)
        part = rows[i:j]
        return iter(part[::-1] if reverse else part)

    def get_by_id(self, ns: str, _id: Any) -> dict[str, Any] | None:
        return self.docs.get(encode_value(_id))

    def collscan(self) -> Iterator[tuple[bytes, dict[str, Any]]]:
        for id_enc in self.order:
            yield id_enc, self.docs[id_enc]

    def access(self, ns: str = "db.c") -> Access:
        return Access(self, ns, self.collscan, location=lambda d: encode_value(d["_id"]))
