"""The list-append history checker (libs/listappend.py, issue 33): each anomaly it names is found
in a history built to have it, and a serial execution never has one (a property test)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from libs.listappend import Op, Txn, check


def a(key, value):
    return Op("append", key, value)


def r(key, *values):
    return Op("r", key, tuple(values))


def t(i, *ops, status="ok", at=None):
    invoked, completed = at if at is not None else (float(i), float(i) + 0.5)
    return Txn(i, tuple(ops), status, invoked, completed)


def kinds(history):
    return set(check(history).counts())


def test_a_serial_history_is_valid():
    h = [t(1, a("x", 1), a("y", 1)), t(2, r("x", 1), a("x", 2)), t(3, r("x", 1, 2), r("y", 1))]
    report = check(h)
    assert report.valid, report.anomalies
    assert report.edges > 0


def test_g0_a_cycle_of_writes():
    # T1 and T2 both append to x and y, in opposite orders.
    h = [t(1, a("x", 1), a("y", 2)), t(2, a("x", 2), a("y", 1)), t(3, r("x", 1, 2), r("y", 1, 2))]
    assert "G0" in kinds(h)


def test_g1a_an_aborted_read():
    assert kinds([t(1, a("x", 1), status="fail"), t(2, r("x", 1))]) >= {"G1a"}


def test_g1b_an_intermediate_read():
    assert "G1b" in kinds([t(1, a("x", 1), a("x", 2)), t(2, r("x", 1))])


def test_g1c_cyclic_information_flow():
    # T1 reads T2's append to y, T2 reads T1's append to x.
    assert "G1c" in kinds([t(1, a("x", 1), r("y", 1)), t(2, a("y", 1), r("x", 1))])


def test_g_single_read_skew():
    # T2 moves an amount: appends to x and y; T1 sees y's append but not x's.
    h = [t(0, a("x", 0), a("y", 0)), t(2, a("x", 1), a("y", 1)), t(1, r("x", 0), r("y", 0, 1)), t(3, r("x", 0, 1))]
    assert kinds(h) == {"G-single"}


def test_g2_write_skew():
    # Each reads the other's key empty, then appends to its own: two rw edges.
    h = [t(1, r("x"), a("y", 1), at=(0, 1)), t(2, r("y"), a("x", 1), at=(0, 1)), t(3, r("x", 1), r("y", 1))]
    assert "G2" in kinds(h)
    assert check(h).violations("snapshot-isolation") == {}, "snapshot isolation allows write skew"
    assert "G2" in check(h).violations("serializable")


def test_a_lost_append_a_duplicate_and_incompatible_orders():
    h = [t(1, a("x", 1), at=(0, 1)), t(2, r("x"), at=(2, 3))]
    assert kinds(h) == {"lost-append"}
    assert "duplicated" in kinds([t(1, a("x", 1)), t(2, r("x", 1, 1))])
    h = [t(1, a("x", 1)), t(2, a("x", 2)), t(3, r("x", 1, 2)), t(4, r("x", 2, 1))]
    assert "incompatible-order" in kinds(h)


def test_an_unknown_outcome_may_have_committed_and_is_never_lost():
    h = [t(1, a("x", 1), status="info", at=(0, 1)), t(2, r("x", 1), at=(2, 3)), t(3, r("x", 1), at=(4, 5))]
    assert check(h).valid
    assert check([t(1, a("x", 1), status="info", at=(0, 1)), t(2, r("x"), at=(2, 3))]).valid


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.lists(st.tuples(st.sampled_from(["append", "r"]), st.sampled_from(["x", "y", "z"])), min_size=1, max_size=4),
        max_size=12,
    )
)
def test_any_serial_execution_is_valid(programs):
    """Run the transactions one after another on real lists: no anomaly, whatever they do."""
    state: dict[str, list[int]] = {}
    history, counter = [], 0
    for i, program in enumerate(programs):
        ops = []
        for f, key in program:
            if f == "append":
                counter += 1
                state.setdefault(key, []).append(counter)
                ops.append(a(key, counter))
            else:
                ops.append(r(key, *state.get(key, [])))
        history.append(t(i, *ops, at=(2.0 * i, 2.0 * i + 1)))
    report = check(history)
    assert report.valid, report.anomalies
