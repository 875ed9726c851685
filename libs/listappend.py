"""A checker of transaction histories in Elle's list-append workload (Kingsbury & Alvaro, "Elle:
inferring isolation anomalies from experimental observations", VLDB 2020), written here for
shardlog's transactions (issue 33): run on a short history in CI and a long one by a bench.

Each transaction appends unique values to lists kept under keys and reads whole lists.  Because a
list holds its whole past, every read reveals a prefix of the key's version order, and the
dependencies between transactions follow:

    ww  T1 appended x, T2 appended the element right after x                 T1 -> T2
    wr  T2 read a list whose last element T1 appended                         T1 -> T2
    rw  T1 read a list ending in x (or empty), T2 appended the element after  T1 -> T2

A cycle of ww edges only is G0 (write cycle); of ww and wr, G1c (cyclic information flow); with
exactly one rw, G-single (read skew); with more, G2.  Without cycles: G1a (a read saw an append
of a transaction that failed), G1b (a read saw an append that was not its transaction's last to
that key), incompatible orders (two reads of a key, neither a prefix of the other), duplicated
elements, and lost appends (a committed append missing from a read that began after it
completed).  Transactions whose outcome is unknown (`info`) may have committed: their appends may
be seen, and are never called lost.

Pure: a history in, a report out."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

# What each consistency model allows of the anomalies the checker names.
ALLOWED: dict[str, frozenset[str]] = {"serializable": frozenset(), "snapshot-isolation": frozenset({"G2"})}

Key = Hashable
Value = Hashable


@dataclass(frozen=True)
class Op:
    """One micro-operation: ("append", key, value) or ("r", key, the list read, None: unread)."""

    f: Literal["append", "r"]
    key: Key
    value: Value | tuple[Value, ...] | None


@dataclass(frozen=True)
class Txn:
    """A transaction as the client saw it: its operations (with what the reads returned),
    whether it committed (`ok`), failed for sure (`fail`) or is unknown (`info`), and the
    client's clock when it was invoked and when it completed (for lost appends)."""

    id: int
    ops: tuple[Op, ...]
    status: Literal["ok", "fail", "info"]
    invoked: float = 0.0
    completed: float = 0.0


@dataclass
class Report:
    anomalies: dict[str, list[str]] = field(default_factory=dict)
    transactions: int = 0
    edges: int = 0

    def add(self, kind: str, what: str) -> None:
        self.anomalies.setdefault(kind, []).append(what)

    @property
    def valid(self) -> bool:
        """Serializable: no anomaly at all."""
        return not self.anomalies

    def violations(self, model: str = "snapshot-isolation") -> dict[str, list[str]]:
        """The anomalies `model` forbids: snapshot isolation (MongoDB's, and shardlog's
        transactions) allows write skew, G2, and nothing else here; serializable allows none."""
        allowed = ALLOWED[model]
        return {k: v for k, v in self.anomalies.items() if k not in allowed}

    def counts(self) -> dict[str, int]:
        return {k: len(v) for k, v in sorted(self.anomalies.items())}


def check(history: Iterable[Txn]) -> Report:
    txns = list(history)
    report = Report(transactions=len(txns))
    writer, last_append_of = _writers(txns, report)
    orders = _version_orders(txns, report)
    _aborted_and_intermediate_reads(txns, writer, last_append_of, report)
    _lost_appends(txns, report)
    graph = _dependencies(txns, writer, orders)
    report.edges = sum(len(out) for out in graph.values())
    _cycles(graph, report)
    return report


def _writers(txns: Sequence[Txn], report: Report) -> tuple[dict[tuple[Key, Value], Txn], set[tuple[Key, Value]]]:
    """Who appended each (key, value) (values are unique per key), and the appends that were
    their transaction's last to that key."""
    writer: dict[tuple[Key, Value], Txn] = {}
    last: dict[tuple[int, Key], Value] = {}
    for t in txns:
        for op in t.ops:
            if op.f == "append":
                if (op.key, op.value) in writer:
                    report.add("duplicate-append-in-history", f"{op.value!r} appended to {op.key!r} twice")
                writer[(op.key, op.value)] = t
                last[(t.id, op.key)] = op.value
    return writer, {(k, v) for (_, k), v in last.items()}


def _reads(txns: Sequence[Txn]) -> Iterable[tuple[Txn, Key, tuple[Value, ...]]]:
    for t in txns:
        if t.status != "ok":
            continue  # what a failed or unknown transaction read proves nothing
        for op in t.ops:
            if op.f == "r" and op.value is not None:
                yield t, op.key, tuple(op.value)  # type: ignore[arg-type]


def _version_orders(txns: Sequence[Txn], report: Report) -> dict[Key, tuple[Value, ...]]:
    """Each key's version order: its longest read, every other read a prefix of it."""
    longest: dict[Key, tuple[Value, ...]] = {}
    for t, key, seen in _reads(txns):
        if len(set(seen)) != len(seen):
            report.add("duplicated", f"T{t.id} read {key!r} = {list(seen)}: an element twice")
        if key not in longest or len(seen) > len(longest[key]):
            longest[key] = seen
    for t, key, seen in _reads(txns):
        if longest[key][: len(seen)] != seen:
            report.add(
                "incompatible-order", f"T{t.id} read {key!r} = {list(seen)}, not a prefix of {list(longest[key])}"
            )
    return longest


def _aborted_and_intermediate_reads(
    txns: Sequence[Txn], writer: dict[tuple[Key, Value], Txn], last_appends: set[tuple[Key, Value]], report: Report
) -> None:
    for t, key, seen in _reads(txns):
        for v in seen:
            w = writer.get((key, v))
            if w is None:
                report.add("garbage-read", f"T{t.id} read {v!r} in {key!r}, which no transaction appended")
            elif w.status == "fail":
                report.add("G1a", f"T{t.id} read {v!r} in {key!r}, appended by T{w.id}, which failed")
        if seen:
            tail = seen[-1]
            w = writer.get((key, tail))
            if w is not None and w is not t and (key, tail) not in last_appends:
                report.add("G1b", f"T{t.id} read {key!r} ending in {tail!r}, an intermediate append of T{w.id}")


def _lost_appends(txns: Sequence[Txn], report: Report) -> None:
    """A committed append absent from a read by a transaction invoked after it completed."""
    for reader, key, seen in _reads(txns):
        present = set(seen)
        for t in txns:
            if t.status != "ok" or t is reader or t.completed >= reader.invoked:
                continue
            for op in t.ops:
                if op.f == "append" and op.key == key and op.value not in present:
                    report.add(
                        "lost-append",
                        f"T{t.id}'s append of {op.value!r} to {key!r} is missing from T{reader.id}'s later read",
                    )


Graph = dict[int, dict[int, set[str]]]  # from -> to -> edge kinds


def _dependencies(
    txns: Sequence[Txn], writer: dict[tuple[Key, Value], Txn], orders: dict[Key, tuple[Value, ...]]
) -> Graph:
    graph: Graph = defaultdict(lambda: defaultdict(set))
    committed = {t.id for t in txns if t.status != "fail"}

    def edge(a: Txn, b: Txn, kind: str) -> None:
        if a.id != b.id and a.id in committed and b.id in committed:
            graph[a.id][b.id].add(kind)

    for key, order in orders.items():
        for x, y in zip(order, order[1:], strict=False):
            if (wx := writer.get((key, x))) is not None and (wy := writer.get((key, y))) is not None:
                edge(wx, wy, "ww")
    for t, key, seen in _reads(txns):
        order = orders.get(key, ())
        if seen and (w := writer.get((key, seen[-1]))) is not None:
            edge(w, t, "wr")
        nxt = order[len(seen)] if len(order) > len(seen) else None
        if nxt is not None and (w := writer.get((key, nxt))) is not None:
            edge(t, w, "rw")
    return graph


def _cycles(graph: Graph, report: Report) -> None:
    """Classify the cycles of each strongly connected component, strongest anomaly first."""
    for component in _components(graph):
        if len(component) < 2:
            continue

        if (c := _cycle(graph, component, ("ww",))) is not None:
            report.add("G0", _describe(c))
        elif (c := _cycle(graph, component, ("ww", "wr"))) is not None:
            report.add("G1c", _describe(c))
        elif (c := _single_rw_cycle(graph, component)) is not None:
            report.add("G-single", _describe(c))
        else:
            report.add("G2", f"a cycle through T{sorted(component)[0]} with more than one rw edge")


def _components(graph: Graph) -> list[set[int]]:
    """Tarjan's strongly connected components, iteratively."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    stack: list[int] = []
    on_stack: set[int] = set()
    out: list[set[int]] = []
    counter = 0
    nodes = set(graph) | {b for a in graph for b in graph[a]}
    for root in sorted(nodes):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, {}))))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, {})))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = set()
                while True:
                    n = stack.pop()
                    on_stack.discard(n)
                    comp.add(n)
                    if n == node:
                        break
                out.append(comp)
    return out


def _path(graph: Graph, start: int, goal: int, within: set[int], kinds: tuple[str, ...]) -> list[int] | None:
    """A shortest path start -> goal inside `within` over edges of `kinds` (breadth first)."""
    prev: dict[int, int] = {start: start}
    frontier = [start]
    while frontier:
        nxt = []
        for a in frontier:
            for b, k in sorted(graph.get(a, {}).items()):
                if b in within and b not in prev and k & set(kinds):
                    prev[b] = a
                    if b == goal:
                        path = [b]
                        while path[-1] != start:
                            path.append(prev[path[-1]])
                        return path[::-1]
                    nxt.append(b)
        frontier = nxt
    return None


def _cycle(graph: Graph, component: set[int], kinds: tuple[str, ...]) -> list[tuple[int, str, int]] | None:
    for a in sorted(component):
        for b, k in sorted(graph.get(a, {}).items()):
            if b in component and k & set(kinds) and (back := _path(graph, b, a, component, kinds)) is not None:
                nodes = [a, *back]
                return [(x, _kind(graph, x, y, kinds), y) for x, y in zip(nodes, nodes[1:], strict=False)]
    return None


def _single_rw_cycle(graph: Graph, component: set[int]) -> list[tuple[int, str, int]] | None:
    for a in sorted(component):
        for b, k in sorted(graph.get(a, {}).items()):
            if b in component and "rw" in k and (back := _path(graph, b, a, component, ("ww", "wr"))) is not None:
                nodes = [b, *back[1:]]
                rest = [(x, _kind(graph, x, y, ("ww", "wr")), y) for x, y in zip(nodes, nodes[1:], strict=False)]
                return [(a, "rw", b), *rest]
    return None


def _kind(graph: Graph, a: int, b: int, kinds: tuple[str, ...]) -> str:
    return sorted(graph[a][b] & set(kinds))[0]


def _describe(cycle: list[tuple[int, str, int]]) -> str:
    return " ".join(f"T{a} -{k}->" for a, k, _ in cycle) + f" T{cycle[-1][2]}"
