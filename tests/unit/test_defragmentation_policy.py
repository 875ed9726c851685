"""The balancer's pure policies, no Kafka: the auto-merger, defragmentation
and auto-splitting (docs/reference/defragmentation-and-auto-merge.md, auto-split.md)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from domain import splitvector as asp
from domain.shardkey import MAX_KEY, MIN_KEY, KeyPattern
from services.balancer import automerge as am
from services.balancer import defragment as df
from services.balancer.automerge import ChunkInfo

X = KeyPattern.parse({"x": 1})
NOW = 1_000_000.0
WINDOW = 300  # minSnapshotHistoryWindowInSeconds
MB = 1024 * 1024


def k(v) -> bytes:
    return X.encode_bound({"x": v})


def chunks_of(*spec, **kw) -> list[ChunkInfo]:
    """(min, max, shard) triples with int bounds."""
    return [ChunkInfo(lo, hi, shard, **kw) for lo, hi, shard in spec]


def ranges(actions) -> list[tuple]:
    return [(a["min"], a["max"], a["shard"]) for a in actions]


def merges(chunks, zone_ranges=None, **kw):
    kw.setdefault("now", NOW)
    kw.setdefault("history_window_secs", WINDOW)
    return am.merge_actions("db.coll", chunks, zone_ranges, **kw)


# ====================================================================== auto-merger


SEED_EXAMPLE = [
    ("A", 0, 10, "Shard0"),
    ("B", 10, 20, "Shard0"),
    ("C", 20, 30, "Shard0"),
    ("D", 30, 40, "Shard0"),
    ("E", 40, 50, "Shard1"),
    ("F", 50, 60, "Shard1"),
    ("G", 60, 70, "Shard0"),
    ("H", 70, 80, "Shard0"),
    ("I", 80, 90, "Shard1"),
]
SEED_RESULT = [
    ("A-B-C-D", 0, 40, "Shard0"),
    ("E-F", 40, 60, "Shard1"),
    ("G-H", 60, 80, "Shard0"),
    ("I", 80, 90, "Shard1"),
]


def test_the_worked_example_of_seed_002_exactly():
    # "assumes that history is empty for all chunks and no chunk is flagged as jumbo"
    chunks = [ChunkInfo(k(lo), k(hi), shard) for _, lo, hi, shard in SEED_EXAMPLE]
    actions = merges(chunks)
    assert sorted(ranges(actions)) == sorted(
        [(k(0), k(40), "Shard0"), (k(40), k(60), "Shard1"), (k(60), k(80), "Shard0")]
    )
    assert all(a["type"] == "merge" and a["ns"] == "db.coll" for a in actions)
    # Squash the named chunks as the actions say: the worked example's second table.
    table = [(name, lo, hi, shard) for name, lo, hi, shard in SEED_EXAMPLE]
    for a in actions:
        inside = [r for r in table if a["min"] <= k(r[1]) and k(r[2]) <= a["max"]]
        assert {r[3] for r in inside} == {a["shard"]}
        first = table.index(inside[0])
        table[first : first + len(inside)] = [("-".join(r[0] for r in inside), inside[0][1], inside[-1][2], a["shard"])]
    assert table == SEED_RESULT
    # Nothing is left to merge afterwards.
    assert merges([ChunkInfo(k(lo), k(hi), shard) for _, lo, hi, shard in table]) == []


def test_shard_by_shard_as_the_seed_loop_goes():
    chunks = [ChunkInfo(k(lo), k(hi), shard) for _, lo, hi, shard in SEED_EXAMPLE]
    assert [a["shard"] for a in merges(chunks)] == ["Shard0", "Shard0", "Shard1"]


def test_a_single_chunk_and_an_empty_collection_have_nothing_to_merge():
    assert merges([]) == []
    assert merges(chunks_of((0, 10, "s0"))) == []


def test_another_shard_breaks_a_run():
    assert ranges(merges(chunks_of((0, 1, "s0"), (1, 2, "s0"), (2, 3, "s1"), (3, 4, "s0")))) == [(0, 2, "s0")]


def test_a_gap_breaks_a_run():
    # contiguous means max == next min; a portion of a routing table may skip chunks
    assert merges(chunks_of((0, 1, "s0"), (2, 3, "s0"))) == []
    assert ranges(merges(chunks_of((0, 1, "s0"), (1, 2, "s0"), (5, 6, "s0"), (6, 7, "s0")))) == [
        (0, 2, "s0"),
        (5, 7, "s0"),
    ]


def test_another_zone_breaks_a_run():
    chunks = chunks_of((0, 10, "s0"), (10, 20, "s0"), (20, 30, "s0"), (30, 40, "s0"))
    zones = [(0, 20, "EU"), (20, 40, "US")]
    assert ranges(merges(chunks, zones)) == [(0, 20, "s0"), (20, 40, "s0")]
    # a zone range covering part of the chunks: zoned vs unzoned chunks do not merge
    assert ranges(merges(chunks, [(10, 30, "EU")])) == [(10, 30, "s0")]
    # zones given on the chunks themselves
    tagged = [ChunkInfo(0, 1, "s0", zone="EU"), ChunkInfo(1, 2, "s0", zone="EU"), ChunkInfo(2, 3, "s0")]
    assert ranges(merges(tagged)) == [(0, 2, "s0")]


def test_two_ranges_of_one_zone_merge():
    chunks = chunks_of((0, 10, "s0"), (10, 20, "s0"))
    assert ranges(merges(chunks, [(0, 10, "EU"), (10, 20, "EU")])) == [(0, 20, "s0")]


def test_a_chunk_across_a_zone_boundary_never_merges():
    chunks = chunks_of((0, 10, "s0"), (10, 20, "s0"), (20, 30, "s0"))
    assert ranges(merges(chunks, [(15, 40, "EU")])) == []
    assert ranges(
        merges(chunks_of((0, 10, "s0"), (10, 20, "s0"), (20, 30, "s0"), (30, 40, "s0")), [(25, 99, "EU")])
    ) == [(0, 20, "s0")]


def test_a_jumbo_chunk_breaks_a_run():
    chunks = [
        ChunkInfo(0, 1, "s0"),
        ChunkInfo(1, 2, "s0"),
        ChunkInfo(2, 3, "s0", jumbo=True),
        ChunkInfo(3, 4, "s0"),
        ChunkInfo(4, 5, "s0"),
    ]
    assert ranges(merges(chunks)) == [(0, 2, "s0"), (3, 5, "s0")]


def test_a_chunk_migrated_within_the_history_window_breaks_a_run():
    def run(last_migrated, **kw):
        chunks = [ChunkInfo(0, 1, "s0"), ChunkInfo(1, 2, "s0", last_migrated=last_migrated), ChunkInfo(2, 3, "s0")]
        return ranges(merges(chunks, **kw))

    assert run(None) == [(0, 3, "s0")]  # never migrated
    assert run(NOW - 10) == []
    assert run(NOW - WINDOW) == []  # "more than minSnapshotHistoryWindowInSeconds ago"
    assert run(NOW - WINDOW - 0.5) == [(0, 3, "s0")]
    # ... AND more than transactionLifetimeLimitSeconds ago
    assert run(NOW - WINDOW - 0.5, txn_lifetime_secs=WINDOW + 60) == []
    assert run(NOW - 61, history_window_secs=0) == [(0, 3, "s0")]
    assert run(NOW - 59, history_window_secs=0) == []
    recent_first = [ChunkInfo(0, 1, "s0", last_migrated=NOW - 1), ChunkInfo(1, 2, "s0"), ChunkInfo(2, 3, "s0")]
    assert ranges(merges(recent_first)) == [(1, 3, "s0")]


def test_at_most_ten_merge_actions_outstanding():
    chunks = []
    for i in range(30):  # 30 runs of two chunks, alternating shards
        shard = f"s{i % 2}"
        chunks += [ChunkInfo(4 * i, 4 * i + 2, shard), ChunkInfo(4 * i + 2, 4 * i + 4, shard)]
    assert len(am.mergeable_runs(chunks, now=NOW, history_window_secs=WINDOW)) == 30
    assert len(merges(chunks)) == am.MAX_OUTSTANDING == 10
    assert len(merges(chunks, outstanding=4)) == 6
    assert merges(chunks, outstanding=10) == [] and merges(chunks, outstanding=12) == []
    assert {a["shard"] for a in merges(chunks)} == {"s0"}  # the first shard first


def test_enabled_cluster_wide_and_per_collection_and_not_while_defragmenting():
    assert am.enabled(True, True)
    assert not am.enabled(False, True) and not am.enabled(True, False)
    assert not am.enabled(True, True, defragmenting=True)


def test_interval_and_throttling():
    assert am.scan_due(None, NOW, 3600)
    assert not am.scan_due(NOW - 3599, NOW, 3600) and am.scan_due(NOW - 3600, NOW, 3600)
    assert am.throttle_wait(None, NOW, 15000) == 0
    assert am.throttle_wait(NOW - 5, NOW, 15000) == pytest.approx(10)
    assert am.throttle_wait(NOW - 20, NOW, 15000) == 0


def test_from_collection_uses_the_encoded_bounds():
    class Z:  # duck-typed catalog objects
        def __init__(self, **kw):
            self.__dict__.update(kw)

    coll = Z(
        chunks=[
            Z(min_key=k(MIN_KEY), max_key=k(0), shard="s0", jumbo=False),
            Z(min_key=k(0), max_key=k(MAX_KEY), shard="s0", jumbo=True),
        ],
        zones=[Z(min_key=k(0), max_key=k(MAX_KEY), zone="EU")],
    )
    chunks, zones = am.from_collection(coll, {k(0): 5.0}, {k(MIN_KEY): 7})
    assert chunks[1].jumbo and chunks[1].last_migrated == 5.0 and chunks[0].size == 7
    assert zones == [(k(0), k(MAX_KEY), "EU")]


@st.composite
def routing_tables(draw):
    attrs = draw(
        st.lists(
            st.tuples(
                st.sampled_from(["s0", "s1", "s2"]),
                st.integers(0, 9).map(lambda n: n == 0),
                st.sampled_from([None, None, None, NOW - 10, NOW - 10_000]),
            ),
            max_size=25,
        )
    )
    bounds = [0]
    for w in draw(st.lists(st.integers(1, 40), min_size=len(attrs), max_size=len(attrs))):
        bounds.append(bounds[-1] + w)
    chunks = [
        ChunkInfo(lo, hi, shard, jumbo=jumbo, last_migrated=lm)
        for (lo, hi), (shard, jumbo, lm) in zip(zip(bounds, bounds[1:]), attrs)
    ]
    zcuts = sorted(draw(st.sets(st.one_of(st.sampled_from(bounds), st.integers(0, bounds[-1] + 5)), max_size=4)))
    zones = [(lo, hi, draw(st.sampled_from(["EU", "US"]))) for lo, hi in zip(zcuts[::2], zcuts[1::2])]
    return chunks, zones


@given(routing_tables())
@settings(max_examples=200, deadline=None)
def test_merges_never_span_shards_or_zones_and_are_maximal(table):
    chunks, zones = table
    found = am.mergeable_runs(chunks, zones, now=NOW, history_window_secs=WINDOW)
    zone_of = am.chunk_zones(chunks, zones)
    covered = set()
    for i, j in found:
        run = chunks[i:j]
        assert j - i >= 2
        assert len({c.shard for c in run}) == 1
        assert len({repr(zone_of[x]) for x in range(i, j)}) == 1 and not isinstance(zone_of[i], am.Straddling)
        assert all(not c.jumbo and am.history_purgeable(c, NOW, WINDOW) for c in run)
        for z_lo, z_hi, _ in zones:  # the merged range is inside a zone range or clear of all
            assert (z_lo <= run[0].min and run[-1].max <= z_hi) or run[-1].max <= z_lo or z_hi <= run[0].min
        covered |= set(range(i, j))
    # maximal: two neighbouring eligible chunks alike are always in the same run
    for x in range(len(chunks) - 1):
        a, b = chunks[x], chunks[x + 1]
        if (
            a.shard == b.shard
            and zone_of[x] == zone_of[x + 1]
            and not isinstance(zone_of[x], am.Straddling)
            and all(not c.jumbo and am.history_purgeable(c, NOW, WINDOW) for c in (a, b))
        ):
            assert any(i <= x and x + 1 < j for i, j in found)
    assert len(merges(chunks, zones, outstanding=3)) == min(7, len(found))


@given(routing_tables())
@settings(max_examples=200, deadline=None)
def test_chunk_zones_agree_with_the_definition(table):
    chunks, zones = table
    for c, z in zip(chunks, am.chunk_zones(chunks, list(reversed(zones)))):
        inside = [name for lo, hi, name in zones if lo <= c.min and c.max <= hi]
        overlapping = [name for lo, hi, name in zones if lo < c.max and c.min < hi]
        if inside:
            assert z == inside[0]
        elif overlapping:
            assert isinstance(z, am.Straddling)
        else:
            assert z is None


# ==================================================================== defragmentation


class Cluster:
    """A fake collection that carries the actions out: true sizes, merges, moves."""

    def __init__(self, spec, max_chunk_size=100, zone_ranges=None, shard_sizes=None, draining=()):
        self.chunks = [dict(min=lo, max=hi, shard=sh, size=n) for lo, hi, sh, n in spec]
        self.max_chunk_size, self.zone_ranges = max_chunk_size, zone_ranges
        self.shard_sizes, self.draining = shard_sizes, frozenset(draining)
        self.known: dict[tuple, int] = {}  # sizes the catalog would hold (from phase 1)
        self.log: list[dict] = []

    def snapshot(self) -> df.Snapshot:
        return df.Snapshot(
            [ChunkInfo(c["min"], c["max"], c["shard"], size=None) for c in self.chunks],
            self.max_chunk_size,
            self.zone_ranges,
            self.shard_sizes,
            self.draining,
        )

    def run(self, a: dict) -> tuple[bool, str | None, int | None]:
        self.log.append(a)
        inside = [c for c in self.chunks if a["min"] <= c["min"] and c["max"] <= a["max"]]
        if a["type"] == "merge":
            if (
                not inside
                or inside[0]["min"] != a["min"]
                or inside[-1]["max"] != a["max"]
                or {c["shard"] for c in inside} != {a["shard"]}
            ):
                return False, "IllegalOperation", None
            i = self.chunks.index(inside[0])
            self.chunks[i : i + len(inside)] = [
                dict(min=a["min"], max=a["max"], shard=a["shard"], size=sum(c["size"] for c in inside))
            ]
            return True, None, None
        if len(inside) != 1 or (inside[0]["min"], inside[0]["max"]) != (a["min"], a["max"]):
            return False, "IllegalOperation", None
        if a["type"] == "dataSize":
            return True, None, inside[0]["size"]
        inside[0]["shard"] = a["to"]  # move
        return True, None, None


def drive(cluster: Cluster, state=None, *, steps=500, fail=None, roundtrip=False):
    """Run defragmentation to the end; `fail(action) -> error code or None` injects errors."""
    s = state or df.start("db.c")
    for _ in range(steps):
        s, actions = df.next_actions(s, cluster.snapshot())
        if roundtrip:
            s = df.from_json(json.loads(json.dumps(df.to_json(s))))
        if s.phase == df.FINISHED:
            return s
        assert actions or s.outstanding, "stuck"
        for a in actions:
            code = fail(a) if fail else None
            if code:
                s = df.on_result(s, a, False, code)
            else:
                ok, code, size = cluster.run(a)
                s = df.on_result(s, a, ok, code, data_size=size)
            if roundtrip:
                s = df.from_json(json.loads(json.dumps(df.to_json(s))))
    raise AssertionError("did not finish")


def small(c, max_chunk_size=100):
    return c["size"] * 4 < max_chunk_size


def test_phase_1_merges_runs_per_shard_then_measures():
    cl = Cluster([(0, 10, "s0", 5), (10, 20, "s0", 5), (20, 30, "s1", 50), (30, 40, "s0", 30)])
    s, actions = df.next_actions(df.start("db.c"), cl.snapshot())
    assert s.phase == df.MERGE_AND_MEASURE and df.blocks_balancing(s)
    assert [(a["type"], a["min"], a["max"], a["shard"]) for a in actions] == [
        ("merge", 0, 20, "s0"),
        ("dataSize", 20, 30, "s1"),
        ("dataSize", 30, 40, "s0"),
    ]
    assert df.status(s)["remainingChunksToProcess"] == 3
    s = df.on_result(s, actions[0], *cl.run(actions[0])[:2])
    s, more = df.next_actions(s, cl.snapshot())
    assert more == [{"type": "dataSize", "ns": "db.c", "shard": "s0", "min": 0, "max": 20}]  # the merged chunk
    assert s.counters["merges"] == 1


def test_chunks_already_measured_are_not_measured_again():
    snap = df.Snapshot([ChunkInfo(0, 10, "s0", size=5), ChunkInfo(10, 20, "s1")], 100)
    _, actions = df.next_actions(df.start("db.c"), snap)
    assert [(a["type"], a["min"]) for a in actions] == [("dataSize", 10)]


def test_every_phase_in_turn_to_the_end():
    # the small chunk joins a neighbour on s0, which then sits next to s0's other chunk: phase 3 merges them
    cl = Cluster([(0, 10, "s0", 60), (10, 20, "s1", 5), (20, 30, "s0", 60)])
    s, trace = df.start("db.c"), []
    for _ in range(100):
        s, actions = df.next_actions(s, cl.snapshot())
        trace += [(s.phase, a["type"]) for a in actions]
        if s.phase == df.FINISHED:
            break
        for a in actions:
            ok, code, size = cl.run(a)
            s = df.on_result(s, a, ok, code, data_size=size)
    assert trace == [(df.MERGE_AND_MEASURE, "dataSize")] * 3 + [
        (df.MOVE_AND_MERGE, "move"),
        (df.MOVE_AND_MERGE, "merge"),
        (df.MERGE, "merge"),
    ]
    assert cl.chunks == [{"min": 0, "max": 30, "shard": "s0", "size": 125}]
    assert not df.blocks_balancing(s) and s.sizes == {}  # sizes are cleaned up at the end
    assert df.status(s)["state"] == "finished" and s.counters == {
        "merges": 2,
        "dataSizes": 3,
        "moves": 1,
        "retries": 0,
        "restarts": 0,
    }


def test_phase_1_to_2_waits_for_the_actions_in_flight():
    cl = Cluster([(0, 10, "s0", 5), (10, 20, "s1", 5)])
    s, actions = df.next_actions(df.start("db.c"), cl.snapshot())
    s = df.on_result(s, actions[0], True, data_size=5)
    s, more = df.next_actions(s, cl.snapshot())
    assert more == [] and s.phase == df.MERGE_AND_MEASURE and len(s.outstanding) == 1
    s = df.on_result(s, actions[1], True, data_size=5)
    s, more = df.next_actions(s, cl.snapshot())
    assert s.phase == df.MOVE_AND_MERGE and [a["type"] for a in more] == ["move"]


def test_phase_2_moves_a_small_chunk_then_merges_it_with_its_sibling():
    cl = Cluster([(0, 10, "s0", 10), (10, 20, "s1", 50)])
    s = df.DefragState("db.c", phase=df.MOVE_AND_MERGE, sizes={df.range_key(0, 10): 10, df.range_key(10, 20): 50})
    s, actions = df.next_actions(s, cl.snapshot())
    assert actions == [{"type": "move", "ns": "db.c", "shard": "s0", "min": 0, "max": 10, "to": "s1"}]
    assert df.status(s)["remainingChunksToProcess"] == 1
    s = df.on_result(s, actions[0], *cl.run(actions[0])[:2])
    s, actions = df.next_actions(s, cl.snapshot())
    assert actions == [{"type": "merge", "ns": "db.c", "shard": "s1", "min": 0, "max": 20}]
    s = df.on_result(s, actions[0], *cl.run(actions[0])[:2])
    assert s.chunks == [{"min": 0, "max": 20, "shard": "s1", "size": 60, "zone": None, "straddles": False}]
    assert df.known_size(s, 0, 20) == 60 and s.counters["moves"] == 1 and s.counters["merges"] == 1
    assert df.status(s)["remainingChunksToProcess"] == 0
    s, actions = df.next_actions(s, cl.snapshot())
    assert actions == [] and s.phase == df.FINISHED  # phase 3: one chunk, nothing to merge


def test_the_small_chunk_threshold_is_strictly_below_25_percent():
    def moves(size):
        s = df.DefragState("db.c", phase=df.MOVE_AND_MERGE)
        snap = df.Snapshot([ChunkInfo(0, 10, "s0", size=size), ChunkInfo(10, 20, "s1", size=90)], 100)
        return [a["type"] for a in df.next_actions(s, snap)[1]]

    assert moves(24) == ["move"] and moves(25) == []


def pick(chunks, shard_sizes=None, draining=()):
    """The action phase 2 starts with for chunks (min, max, shard, size), max chunk size 100."""
    s = df.DefragState("db.c", phase=df.MOVE_AND_MERGE)
    snap = df.Snapshot(
        [ChunkInfo(lo, hi, sh, size=n) for lo, hi, sh, n in chunks],
        100,
        shard_sizes=shard_sizes,
        draining=frozenset(draining),
    )
    return df.next_actions(s, snap)[1][0]


def test_recipient_scoring_question_1_the_chunks_own_shard_means_a_merge_without_a_move():
    a = pick([(0, 10, "s0", 90), (10, 20, "s0", 5), (20, 30, "s2", 30)], {"s0": 900, "s2": 10})
    assert a == {"type": "merge", "ns": "db.c", "shard": "s0", "min": 0, "max": 20}


def test_recipient_scoring_question_2_outweighs_question_4():
    # s0 (the most data) goes first, its small chunk of 10: s1's 5 is smaller (and s1 has less
    # data), s2's 12 is bigger; neither merge ends smallness
    a = pick([(0, 10, "s1", 5), (10, 20, "s0", 10), (20, 30, "s2", 12)], {"s0": 900, "s1": 10, "s2": 500})
    assert (a["type"], a["min"], a["to"]) == ("move", 10, "s2")


def test_recipient_scoring_question_3_outweighs_question_4():
    # both siblings are bigger; only s2's 16 makes the merged chunk no longer small
    a = pick([(0, 10, "s1", 14), (10, 20, "s0", 10), (20, 30, "s2", 16)], {"s0": 900, "s1": 10, "s2": 500})
    assert (a["type"], a["min"], a["to"]) == ("move", 10, "s2")


def test_recipient_scoring_questions_3_and_4_in_order():
    s = df.DefragState("db.c", max_chunk_size=100, shard_sizes={"s1": 1, "s2": 500})
    chunk = {"shard": "s0", "size": 20}
    left, right = {"shard": "s1", "size": 3}, {"shard": "s2", "size": 6}
    # question 3 (merged 26 >= 25) outweighs question 4 (s1 has less data)
    assert df.score(s, chunk, right, left) == 2 and df.score(s, chunk, left, right) == 1
    big = {"shard": "s2", "size": 90}
    assert df.score(s, chunk, big, left) == 4 + 2  # question 2 and 3
    assert df.score(s, chunk, {"shard": "s0", "size": 1}, None) == 8 + 0 + 0
    assert df.score(s, chunk, {"shard": "s1", "size": 1}, None) == 0  # question 4 needs another recipient


def test_the_recipient_with_less_data_wins_a_tie_then_the_right_sibling():
    a = pick([(0, 10, "s1", 50), (10, 20, "s0", 5), (20, 30, "s2", 50)], {"s0": 900, "s1": 100, "s2": 200})
    assert a["to"] == "s1"
    a = pick([(0, 10, "s1", 50), (10, 20, "s0", 5), (20, 30, "s2", 50)], {"s0": 900, "s1": 200, "s2": 200})
    assert a["to"] == "s2"


def test_phase_2_keeps_to_zones_and_away_from_draining_shards():
    # the small chunk's only same-zone sibling is on a draining shard: nothing to do
    s = df.DefragState("db.c", phase=df.MOVE_AND_MERGE)
    snap = df.Snapshot(
        [ChunkInfo(0, 10, "s1", size=50), ChunkInfo(10, 20, "s0", size=5), ChunkInfo(20, 30, "s2", size=50)],
        100,
        zone_ranges=[(0, 20, "EU")],
        draining=frozenset({"s1"}),
    )
    s, actions = df.next_actions(s, snap)
    assert actions == [] and s.phase == df.FINISHED  # phase 3 had nothing to merge either


def test_one_migration_per_shard_at_a_time():
    s = df.DefragState("db.c", phase=df.MOVE_AND_MERGE)
    snap = df.Snapshot(
        [
            ChunkInfo(0, 10, "s0", size=5),
            ChunkInfo(10, 20, "s1", size=50),
            ChunkInfo(20, 30, "s0", size=6),
            ChunkInfo(30, 40, "s1", size=50),
        ],
        100,
    )
    s, actions = df.next_actions(s, snap)
    assert [(a["type"], a["min"]) for a in actions] == [("move", 0)]


def test_phase_2_without_every_size_goes_back_to_phase_1():
    s = df.DefragState("db.c", phase=df.MOVE_AND_MERGE)
    s, actions = df.next_actions(s, df.Snapshot([ChunkInfo(0, 10, "s0", size=5), ChunkInfo(10, 20, "s1")], 100))
    assert s.phase == df.MERGE_AND_MEASURE and s.counters["restarts"] == 1
    assert [(a["type"], a["min"]) for a in actions] == [("dataSize", 10)]


def test_a_retriable_error_issues_the_same_action_again():
    cl = Cluster([(0, 10, "s0", 5), (10, 20, "s0", 5), (20, 30, "s1", 60)])
    s, actions = df.next_actions(df.start("db.c"), cl.snapshot())
    merge = actions[0]
    s = df.on_result(s, merge, False, "StaleConfig")
    assert s.counters["retries"] == 1 and s.phase == df.MERGE_AND_MEASURE
    s, again = df.next_actions(s, cl.snapshot())
    assert again == [merge]


@pytest.mark.parametrize(
    "phase, back_to",
    [(df.MERGE_AND_MEASURE, df.MERGE_AND_MEASURE), (df.MOVE_AND_MERGE, df.MERGE_AND_MEASURE), (df.MERGE, df.MERGE)],
)
def test_a_non_retriable_error_restarts_the_phase_the_seed_says(phase, back_to):
    snap = df.Snapshot(
        [
            ChunkInfo(0, 10, "s0", size=5),
            ChunkInfo(10, 20, "s0", size=5),
            ChunkInfo(20, 30, "s1", size=50),
            ChunkInfo(30, 40, "s2", size=5),
            ChunkInfo(40, 50, "s3", size=50),
            ChunkInfo(50, 60, "s3", size=50),
        ],
        100,
    )
    s, actions = df.next_actions(df.DefragState("db.c", phase=phase), snap)
    assert s.phase == phase and len(actions) >= 2, actions
    first, rest = actions[0], actions[1:]
    s = df.on_result(s, first, False, "IllegalOperation")
    assert s.restart_phase == back_to and s.pending == [] and s.counters["restarts"] == 1
    assert df.status(s)["state"] == "restarting"
    s, more = df.next_actions(s, snap)
    assert more == [] and s.phase == phase  # the actions in flight answer first...
    for a in rest:
        s = df.on_result(s, a, True, data_size=1 if a["type"] == "dataSize" else None)
    assert s.phase == back_to and not s.built and s.restart_phase is None  # ...then the phase starts over
    s, again = df.next_actions(s, snap)
    assert s.phase == back_to and again


def test_a_retriable_move_keeps_its_pair_and_is_reissued():
    s = df.DefragState("db.c", phase=df.MOVE_AND_MERGE)
    snap = df.Snapshot([ChunkInfo(0, 10, "s0", size=5), ChunkInfo(10, 20, "s1", size=50)], 100)
    s, (move,) = df.next_actions(s, snap)
    s = df.on_result(s, move, False, "ConflictingOperationInProgress")
    assert len(s.pairs) == 1
    s, again = df.next_actions(s, snap)
    assert again == [move]


def test_whole_runs_with_errors_finish_and_leave_no_small_chunk_with_a_sibling():
    spec = [
        (i * 10, i * 10 + 10, f"s{(i * 7) % 3}", n)
        for i, n in enumerate([3, 4, 50, 2, 2, 2, 8, 90, 1, 1, 30, 5, 5, 5, 40, 7])
    ]
    flaky = {"n": 0}

    def fail(a):
        flaky["n"] += 1
        if flaky["n"] % 7 == 0:
            return "StaleConfig"
        if flaky["n"] == 30:
            return "IllegalOperation"
        return None

    cl = Cluster(spec)
    s = drive(cl, fail=fail)
    assert s.counters["retries"] > 0 and s.counters["restarts"] >= 1
    assert sum(c["size"] for c in cl.chunks) == sum(n for *_, n in spec)
    for i, c in enumerate(cl.chunks):  # phase 3: no two neighbours left on one shard
        if i:
            assert cl.chunks[i - 1]["shard"] != c["shard"]
    assert not any(small(c) for c in cl.chunks) or len(cl.chunks) == 1


def test_state_round_trips_through_json_and_replays_the_same():
    spec = [(k(i * 10), k(i * 10 + 10), f"s{i % 3}", n) for i, n in enumerate([3, 4, 50, 2, 2, 8, 90, 1, 30, 5])]
    plain, replayed = Cluster(spec), Cluster(spec)
    a, b = drive(plain), drive(replayed, roundtrip=True)
    assert plain.log == replayed.log and plain.chunks == replayed.chunks
    assert df.to_json(a) == df.to_json(b)
    # a state mid-way, with bytes bounds, survives JSON exactly
    s, actions = df.next_actions(df.start("db.c"), Cluster(spec).snapshot())
    text = json.dumps(df.to_json(s))
    assert df.from_json(json.loads(text)) == s
    assert df.decode_action(json.loads(json.dumps(df.encode_action(actions[0])))) == actions[0]


def test_resume_after_a_balancer_restart_rebuilds_the_current_phase():
    cl = Cluster([(0, 10, "s0", 5), (10, 20, "s1", 60), (20, 30, "s1", 60)])
    s, actions = df.next_actions(df.start("db.c"), cl.snapshot())
    s = df.on_result(s, actions[0], *cl.run(actions[0])[:2])  # phase 1 merge done; the rest lost in a crash
    s = df.resume(df.from_json(df.to_json(s)))
    assert s.outstanding == [] and s.phase == df.MERGE_AND_MEASURE and not s.built
    s = drive(cl, s)
    assert s.phase == df.FINISHED
    assert [(c["min"], c["max"], c["shard"]) for c in cl.chunks] == [(0, 30, "s1")]


def test_stop_finishes_once_the_actions_in_flight_answer():
    cl = Cluster([(0, 10, "s0", 5), (10, 20, "s0", 5), (20, 30, "s1", 60)])
    s, actions = df.next_actions(df.start("db.c"), cl.snapshot())
    s = df.stop(s)
    assert df.status(s)["state"] == "stopping" and df.blocks_balancing(s)
    assert df.next_actions(s, cl.snapshot())[1] == []
    for a in actions:
        s = df.on_result(s, a, True, data_size=60 if a["type"] == "dataSize" else None)
    assert s.phase == df.FINISHED and not df.blocks_balancing(s)
    assert df.status(s)["stopped"] and df.status(s)["state"] == "finished"
    assert df.stop(df.start("db.c")).phase == df.FINISHED  # nothing in flight: at once


def test_an_unknown_answer_is_ignored():
    s = df.start("db.c")
    assert df.on_result(s, {"type": "merge", "ns": "db.c", "shard": "s0", "min": 0, "max": 1}, True) == s


def test_status_shows_progress():
    cl = Cluster([(0, 10, "s0", 5), (10, 20, "s0", 5), (20, 30, "s1", 60)])
    s, _ = df.next_actions(df.start("db.c"), cl.snapshot())
    st_ = df.status(s)
    assert st_ == {
        "ns": "db.c",
        "currentPhase": df.MERGE_AND_MEASURE,
        "state": "running",
        "stopped": False,
        "remainingChunksToProcess": 2,
        "outstanding": 2,
        "pending": 0,
        "merges": 0,
        "dataSizes": 0,
        "moves": 0,
        "retries": 0,
        "restarts": 0,
    }
    json.dumps(st_)


@given(
    st.lists(st.tuples(st.sampled_from(["s0", "s1", "s2"]), st.integers(0, 120)), min_size=1, max_size=14),
    st.sets(st.integers(0, 14), max_size=3),
)
@settings(max_examples=60, deadline=None)
def test_defragmentation_always_finishes_and_keeps_the_data(spec, zone_cuts):
    chunks = [(i * 10, i * 10 + 10, sh, n) for i, (sh, n) in enumerate(spec)]
    cuts = sorted(c * 10 for c in zone_cuts if c <= len(spec))
    zones = [(lo, hi, f"z{lo}") for lo, hi in zip(cuts[::2], cuts[1::2]) if lo < hi]
    cl = Cluster(chunks, zone_ranges=zones)
    drive(cl, steps=2000)
    assert sum(c["size"] for c in cl.chunks) == sum(n for *_, n in chunks)
    assert cl.chunks[0]["min"] == 0 and cl.chunks[-1]["max"] == len(spec) * 10
    zone_of = am.chunk_zones([ChunkInfo(c["min"], c["max"], c["shard"]) for c in cl.chunks], zones)
    assert not any(isinstance(z, am.Straddling) for z in zone_of)  # no merge crossed a zone boundary


# ======================================================================= auto-split


def docs(*keys, size=1):
    return [(key, size) for key in keys]


def test_no_split_below_the_max_chunk_size():
    assert asp.split_points(docs(*range(99)), 100) == asp.SplitVector([])
    assert asp.split_points([], 100) == asp.SplitVector([])


def test_split_points_make_pieces_of_about_half_the_max_size():
    sv = asp.split_points([(k(i), 1000) for i in range(1000)], 100_000)  # 1 MB, max 100 kB
    assert not sv.jumbo and len(sv.points) == 19
    assert sv.points[0] == k(50) and sv.points[1] == k(100)  # 50 documents = 50 kB = half
    # with uneven sizes the number of documents per piece follows the average size
    sv = asp.split_points([(i, 10 if i % 2 else 30) for i in range(100)], 1000)  # avg 20, 25 per piece
    assert sv.points == [25, 50, 75]


def test_equal_keys_are_never_split():
    keys = [1] * 3 + [2] * 10 + [3] * 2 + [4] * 2 + [5]
    sv = asp.split_points(docs(*keys, size=10), 80)  # 4 documents per piece
    assert sv.points == [2, 3, 5]  # [1,1,1] [2 x10 on its own] [3,3,4,4] [5]
    assert asp.pieces(0, 99, sv.points) == [(0, 2), (2, 3), (3, 5), (5, 99)]


def test_one_shard_key_value_over_the_max_is_jumbo():
    assert asp.split_points(docs(*[7] * 50, size=10), 100) == asp.SplitVector([], jumbo=True)
    assert asp.split_points(docs(*[7] * 5, size=10), 100) == asp.SplitVector([])  # small: just not split


def test_max_chunk_objects_caps_the_documents_per_piece():
    assert asp.split_points(docs(*range(10)), 10, max_chunk_objects=2).points == [2, 4, 6, 8]


def test_needs_split():
    assert asp.needs_split(100, 100, enabled=True)
    assert not asp.needs_split(99, 100, enabled=True)
    assert not asp.needs_split(500, 100, enabled=False)  # auto-split is off by default (CollectionSettings)
    assert not asp.needs_split(500, 100, enabled=True, split_in_progress=True)
    assert not asp.needs_split(500, 100, enabled=True, jumbo=True)


def test_median_point():
    assert asp.median_point(docs(*range(10))) == 5
    assert asp.median_point(docs(1, 1, 1, 1, 1, 2, 2, 3, 3, 3)) == 2  # boundary at 5 of 10
    assert asp.median_point(docs(1, 1, 1, 1, 1, 1, 1, 2, 3, 3)) == 2  # nearest boundary to 5: 7 (not 8)
    assert asp.median_point(docs(1, 2, 2, 2, 2, 2, 2, 2, 2, 2)) == 2
    assert asp.median_point(docs(4, 4, 4)) is None and asp.median_point([]) is None


def test_top_chunk_optimisation_for_ascending_keys():
    d = docs(*range(100))
    plan = asp.top_chunk(d, [50], chunk_min=0, chunk_max=MAX_KEY, is_bottom=False, is_top=True, hashed=False)
    assert plan.points == [50, 99] and plan.move == (99, MAX_KEY)


def test_top_chunk_optimisation_for_descending_keys():
    d = docs(*range(100))
    plan = asp.top_chunk(d, [50], chunk_min=MIN_KEY, chunk_max=200, is_bottom=True, is_top=False, hashed=False)
    assert plan.points == [1, 50] and plan.move == (MIN_KEY, 1)
    d = docs(0, 0, 0, *range(1, 100))  # the lowest key's documents stay together
    assert asp.top_chunk(
        d, [50], chunk_min=MIN_KEY, chunk_max=200, is_bottom=True, is_top=False, hashed=False
    ).move == (MIN_KEY, 1)


def test_no_top_chunk_optimisation_in_the_middle_for_hashed_keys_or_without_a_split():
    d = docs(*range(100))
    for kw in (dict(is_bottom=False, is_top=False, hashed=False), dict(is_bottom=False, is_top=True, hashed=True)):
        assert asp.top_chunk(d, [50], chunk_min=0, chunk_max=100, **kw) == asp.TopChunkPlan([50], None)
    assert asp.top_chunk(
        d, [], chunk_min=0, chunk_max=100, is_bottom=True, is_top=True, hashed=False
    ) == asp.TopChunkPlan([], None)
    # the last point already isolates the highest key
    plan = asp.top_chunk(d, [99], chunk_min=0, chunk_max=MAX_KEY, is_bottom=False, is_top=True, hashed=False)
    assert plan == asp.TopChunkPlan([99], (99, MAX_KEY))


@given(st.lists(st.tuples(st.integers(0, 30), st.integers(1, 50)), max_size=200), st.integers(20, 2000))
@settings(max_examples=300, deadline=None)
def test_split_pieces_are_contiguous_cover_the_chunk_and_keep_equal_keys_together(raw, max_size):
    d = sorted(raw, key=lambda x: x[0])
    sv = asp.split_points(d, max_size)
    keys = [key for key, _ in d]
    assert sv.points == sorted(set(sv.points))  # strictly ascending
    assert all(p in keys and p != keys[0] for p in sv.points)  # a document's key, never empty first piece
    parts = asp.pieces(-1, 31, sv.points)
    assert parts[0][0] == -1 and parts[-1][1] == 31 and all(a[1] == b[0] for a, b in zip(parts, parts[1:]))
    total = sum(size for _, size in d)
    if sv.jumbo:
        assert len(set(keys)) == 1 and total >= max_size and sv.points == []
    if total < max_size:
        assert sv.points == []
    elif len(set(keys)) > 1:
        assert sv.points, "an oversized chunk with two keys is split"
    per_piece = max(1, max_size * len(d) // (2 * total)) if total else 0
    for lo, hi in parts:  # every piece is within the half-size count unless one key fills it
        inside = [key for key in keys if lo <= key < hi]
        assert inside or not d
        assert len(inside) <= per_piece or len(set(inside)) == 1 or not sv.points
    median = asp.median_point(d)
    assert (median is None) == (len(set(keys)) <= 1)
    if median is not None:
        assert keys[0] < median <= keys[-1]


def test_the_functions_never_change_the_state_they_are_given():
    cl = Cluster([(0, 10, "s0", 5), (10, 20, "s1", 60), (20, 30, "s0", 5), (30, 40, "s1", 60)])
    s = df.start("db.c")
    for _ in range(50):
        before = json.dumps(df.to_json(s))
        s2, actions = df.next_actions(s, cl.snapshot())
        assert json.dumps(df.to_json(s)) == before
        for a in actions:
            ok, code, size = cl.run(a)
            mid = json.dumps(df.to_json(s2))
            s3 = df.on_result(s2, a, ok, code, data_size=size)
            assert json.dumps(df.to_json(s2)) == mid
            s2 = s3
        s = s2
        if s.phase == df.FINISHED:
            break
    assert s.phase == df.FINISHED and df.stop(s) == s
