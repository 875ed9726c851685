"""The live cluster page in a real browser (headless chromium) against a live cluster: while a
workload writes and a move-range runs, the page lists the shards, draws the collection's chunk
strip coloured by owning shard, shows the migration's progress changing between two reads, and the
balancer's state.  Screenshots go to .artifacts/ (tests/browser.py)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request

import pytest

from libs.requests import Requester
from schemas import config as c
from services.balancer.server import Balancer
from services.dashboard.server import Dashboard, load_figures
from services.shard import donor
from tests.conftest import ROOT, wait_until

pytestmark = pytest.mark.kafka

NS = "app.users"
MINK, MAXK = {"$minKey": 1}, {"$maxKey": 1}
MOVED = 3000  # documents in the range the observed migration moves


def start(cl, service) -> None:
    """Run a service on the in-process cluster's loop (stopped with it)."""

    async def go():
        cl.tasks.append(asyncio.create_task(service.run()))

    cl.call(go())


def outcome(cl, mid: str) -> str:
    async def go():
        async with Requester(cl.settings.bootstrap, cl.settings.topics.cli_replies) as r:
            rep = await r.request(cl.settings.topics.config_commands, c.GetMigration(id=mid), timeout=30)
            return rep.result["state"]

    return cl.call(go())


# The page redraws every second, replacing its elements: every read is one script run in the page,
# so it never holds an element the next redraw has replaced.
def attrs(browser, css: str, *names: str) -> list[tuple]:
    """The given attributes of every element matching `css`, in document order."""
    rows = browser.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => arguments[1].map(n => e.getAttribute(n)))",
        css,
        list(names),
    )
    return [tuple(r) for r in rows]


def text(browser, css: str) -> str:
    """The visible text of the first element matching `css` ("" if none)."""
    return browser.execute_script("const e = document.querySelector(arguments[0]); return e ? e.innerText : ''", css)


def colours(browser, css: str) -> list[tuple[str, str]]:
    """(data-shard, computed background colour) of every element matching `css`."""
    rows = browser.execute_script(
        "return [...document.querySelectorAll(arguments[0])].map(e => [e.closest('[data-shard]').getAttribute('data-shard'),"
        " getComputedStyle(e).backgroundColor])",
        css,
    )
    return [tuple(r) for r in rows]


def test_the_page_shows_shards_chunks_a_migration_in_progress_and_the_balancer(
    data_cluster, browser, screenshot, monkeypatch
):
    cl = data_cluster
    # Clone in small batches, so the move of MOVED documents takes many round trips to watch.
    monkeypatch.setattr(donor, "CLONE_BATCH_DOCS", 10)
    cl.command(c.SetSetting(key="balancerEnabled", value=False))  # the balancer answers, but moves nothing
    cl.command(c.CreateDatabase(db="app", primary="s0"))
    cl.command(c.ShardCollection(ns=NS, key={"k": 1}))
    cl.command(c.SplitChunk(ns=NS, at=[{"k": MOVED}, {"k": 2 * MOVED}]))
    cl.mongo_client()["app"]["users"].insert_many([{"_id": i, "k": i, "v": "x" * 200} for i in range(MOVED)])
    reply = cl.command(c.MoveRange(ns=NS, min={"k": 2 * MOVED}, max={"k": MAXK}, to="s2"))
    wait_until(lambda: outcome(cl, reply.result["id"]) == "committed", 60, "the empty chunk to move to s2")

    board = Dashboard(cl.settings, port=0, tracing_ui="http://127.0.0.1:9411/zipkin", figures=load_figures(cl.settings))
    start(cl, Balancer(cl.settings))
    start(cl, board)
    wait_until(board.serving.is_set, 60, "the dashboard to serve its page")
    url = board.url

    # A workload writes next to the moving range (k >= MOVED stays on s0) for the whole test.
    stop = threading.Event()
    written = []

    def workload():
        coll = cl.mongo_client()["app"]["users"]
        i = 0
        while not stop.is_set():
            coll.insert_one({"_id": f"w{i}", "k": MOVED + i % MOVED, "v": "w"})
            written.append(i)
            i += 1

    writer = threading.Thread(target=workload, daemon=True)
    writer.start()
    try:
        browser.get(url)
        wait_until(
            lambda: int(attrs(browser, "body", "data-refreshes")[0][0]) > 0,
            30,
            "a first refresh",
        )
        assert attrs(browser, "#shards tr.shard", "data-shard") == [("s0",), ("s1",), ("s2",)]
        wait_until(
            lambda: attrs(browser, "#balancer", "data-answering", "data-enabled") == [("true", "false")],
            60,
            "the balancer's answer (on the page: answering, disabled)",
            detail=lambda: text(browser, "#balancer"),
        )
        assert "stopped (balancerEnabled is false)" in text(browser, '#balancer dd[data-field="now"]')

        # The move of [MinKey, MOVED) to s1, watched on the page.
        move = cl.command(c.MoveRange(ns=NS, min={"k": MINK}, max={"k": MOVED}, to="s1"))
        mid = move.result["id"]
        sel = f'.migration[data-id="{mid}"]'
        first = wait_until(
            lambda: [
                a
                for a in attrs(browser, sel, "data-phase", "data-cloned")
                if a[0] == "cloning" and a[1] not in ("", "0")
            ],
            60,
            f"migration {mid} cloning with documents cloned, on the page",
            detail=lambda: text(browser, "#migrations"),
        )[0]
        screenshot("migration-cloning")
        wait_until(
            lambda: [a for a in attrs(browser, sel, "data-cloned", "data-phase") if a[0] and int(a[0]) > int(first[1])],
            60,
            f"the migration's progress to grow on the page (first read: {first[1]} documents cloned)",
            detail=lambda: text(browser, "#migrations"),
        )
        shown = text(browser, sel)
        assert "s0 → s1" in shown and NS in shown and "documents" in shown, shown
        (width,) = attrs(browser, f"{sel} .bar > div", "style")
        assert "width:" in width[0].replace(" ", ""), width
        screenshot("migration-progressed")

        wait_until(lambda: outcome(cl, mid) == "committed", 120, f"migration {mid} to commit")
        # The strip: one block per chunk, in key order, each with its owner's legend colour.
        expected = [ch.shard for ch in cl.router.follower.catalog.collections[NS].chunks]
        assert expected == ["s1", "s0", "s2"]
        strip = f'.collection[data-ns="{NS}"] .strip .chunk'
        wait_until(
            lambda: (
                [a[0] for a in attrs(browser, strip, "data-shard")] == expected and not attrs(browser, sel, "data-id")
            ),
            30,
            "the strip to show the chunks after the move, and the migration gone",
            detail=lambda: str(attrs(browser, strip, "data-shard")),
        )
        assert attrs(browser, f'.collection[data-ns="{NS}"] .strip', "data-chunks") == [("3",)]
        legend = dict(colours(browser, "#legend li[data-shard] .swatch"))
        blocks = colours(browser, strip)
        assert [shard for shard, _ in blocks] == expected
        assert [colour for _, colour in blocks] == [legend[shard] for shard in expected], (blocks, legend)
        assert len(set(legend.values())) == 3, legend  # three shards, three colours
        assert [a[0] for a in attrs(browser, "#shards tr.shard", "data-chunks")] == ["1", "1", "1"]
        links = [a[0] for a in attrs(browser, "#shards a.traces", "href")]
        assert links[0] == "http://127.0.0.1:9411/zipkin/?serviceName=shardlog-shard-s0", links
        screenshot("after-the-move")

        # The placement a second before the move committed: the slider recolours the strip from
        # each chunk's history (config.chunks' validAfter), the moved range back on its donor.
        coll = cl.router.follower.catalog.collections[NS]
        moved_at = coll.chunk_history(coll.chunks[0])[0][0] >> 32
        before = moved_at - 1
        assert before >= coll.history_from >> 32, "the collection was created less than a second before the move"
        past = [next((s for t, s in coll.chunk_history(ch) if t >> 32 <= before), "") for ch in coll.chunks]
        assert past[0] == "s0", past
        browser.execute_script(
            "const s = document.getElementById('placement-at'); s.value = arguments[0];"
            " s.dispatchEvent(new Event('input'))",
            str(before),
        )
        wait_until(
            lambda: (
                [a[0] for a in attrs(browser, strip, "data-shard-at")] == past
                and attrs(browser, "#placement", "data-past") == [("true",)]
            ),
            30,
            f"the strip as it was at second {before}: {past}",
            detail=lambda: str(attrs(browser, strip, "data-shard-at")),
        )
        assert [c for _, c in colours(browser, strip)][0] == legend["s0"]
        screenshot("placement-before-the-move")
        browser.execute_script("document.getElementById('placement-now').click()")
        wait_until(
            lambda: [a[0] for a in attrs(browser, strip, "data-shard-at")] == expected,
            30,
            "the strip back to the placement now",
            detail=lambda: str(attrs(browser, strip, "data-shard-at")),
        )

        # The last minute's figures (the faust app's windows of the services' metric summaries):
        # the workload's inserts make the collection and s0 (which owns k >= MOVED) busy.
        assert written, "the workload wrote nothing while the page was watched"

        def busy() -> dict[tuple[str, str], float]:
            rows = attrs(browser, "#figures tr.figure", "data-kind", "data-name", "data-ops")
            return {(kind, name): float(ops) for kind, name, ops in rows if ops}

        wait_until(
            lambda: busy().get(("collection", NS), 0) > 0 and busy().get(("shard", "s0"), 0) > 0,
            60,
            "non-zero ops/s for the collection and for s0 on the page",
            detail=lambda: text(browser, "#figures"),
        )
        assert "ms" in text(browser, '#figures tr.figure[data-kind="shard"][data-name="s0"] .p99')
        screenshot("figures")
    finally:
        stop.set()
        writer.join(30)

    # The JSON behind the page, as `shardlog top` reads it.
    with urllib.request.urlopen(url + "api/snapshot", timeout=10) as r:
        snap = json.load(r)
    assert [s["id"] for s in snap["shards"]] == ["s0", "s1", "s2"] and "figures" in snap


def test_shardlog_dashboard_serves_in_the_foreground_and_prints_its_url(settings, tmp_path):

    out = tmp_path / "dashboard.out"
    with open(out, "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "cli.main", "--bootstrap", settings.bootstrap, "--cluster", settings.cluster]
            + ["dashboard", "--port", "0"],
            cwd=ROOT,
            stdout=f,
            stderr=subprocess.STDOUT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )
    try:
        found = wait_until(
            lambda: re.search(r"(http://127\.0\.0\.1:\d+/)", out.read_text()),
            60,
            "`shardlog dashboard` to print its URL",
            detail=lambda: out.read_text()[-2000:],
        )
        url = found.group(1)
        assert f"cluster {settings.cluster!r}" in out.read_text()
        with urllib.request.urlopen(url + "api/snapshot", timeout=10) as r:
            snap = json.load(r)
        assert snap["cluster"] == settings.cluster and snap["shards"] == [] and snap["collections"] == []
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(url + "api/nope", timeout=10)
        assert e.value.code == 404 and json.load(e.value)["codeName"] == "CommandNotFound"
    finally:
        proc.send_signal(signal.SIGINT)
        rc = proc.wait(30)
    assert rc == 0, out.read_text()[-2000:]


def test_shardlog_dashboard_says_clearly_when_the_cluster_does_not_exist(bootstrap):

    r = subprocess.run(
        [sys.executable, "-m", "cli.main", "--bootstrap", bootstrap, "--cluster", "nosuchcluster0", "dashboard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert r.returncode != 0 and "nosuchcluster0" in r.stderr, r.stderr
