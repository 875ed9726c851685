"""Traces in a real Zipkin (infra/zipkin/local.py, what `make up` starts): services in their
own processes export their spans to it, one client operation is one trace through the router
and the owning shard, a `move-range` one trace through the config server and both shards; the
same traces through Zipkin's HTTP API and in its UI in a real browser (screenshots kept).

What is asserted is what the services emit today; SPANS below lists the span names each check
expects, so a new span (a shard transaction, a migration phase) is one more line there.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import urllib.request

import pytest

from tests.conftest import ROOT, cli, wait_until

pytestmark = pytest.mark.kafka

LOCAL_ZIPKIN = ROOT / "infra" / "zipkin" / "local.py"
NS = "app.traced"

# Span names (Zipkin lower-cases them) each trace must hold, per service: "owner", "donor" and
# "recipient" stand for the shards of the test (docs/reference/observability.md, "What a trace
# shows", lists them all; a new one is one more string here).
INSERT_SPANS = {
    "router": ["wire insert", "send {cluster}.shard.{owner}.requests", "receive reply"],
    "owner": ["shard-{owner} insert", "shard-{owner} transaction", "send {cluster}.shard.{owner}.changelog"],
}
MOVE_SPANS = {
    "cli": ["shardlog move-range", "send {cluster}.config.commands"],
    "config": ["config moverange", "send {cluster}.config.events"],
    "donor": ["migration donate", "migration clone", "migration critical section", "migration commit"],
    "recipient": ["shard-{recipient} startreceipt", "shard-{recipient} transaction"],
}


def expected(spans: dict[str, list[str]], **shards: str) -> dict[str, set[str]]:
    """Service name -> span names, the placeholders filled in."""
    return {
        f"shardlog-{'shard-' + shards[who] if who in shards else who}": {n.format(**shards) for n in names}
        for who, names in spans.items()
    }


@pytest.fixture(scope="session")
def zipkin(tmp_path_factory):
    """A Zipkin server on a free port for the session: its base URL."""
    if shutil.which("java") is None:
        pytest.skip("no java (JDK 17) on PATH: Zipkin's server is a Java program")
    d = tmp_path_factory.mktemp("zipkin")
    started = subprocess.run(
        [sys.executable, str(LOCAL_ZIPKIN), "start", "--dir", str(d), "--port", "0"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert started.returncode == 0, started.stdout + started.stderr
    port = int((d / "zipkin.port").read_text())
    yield f"http://127.0.0.1:{port}"
    subprocess.run([sys.executable, str(LOCAL_ZIPKIN), "stop", "--dir", str(d)], timeout=60)


def api(base: str, path: str):
    with urllib.request.urlopen(f"{base}{path}", timeout=10) as r:
        return json.loads(r.read())


def exporting_env(zipkin: str) -> dict[str, str]:
    return {
        "OTEL_TRACES_EXPORTER": "zipkin",
        "OTEL_EXPORTER_ZIPKIN_ENDPOINT": f"{zipkin}/api/v2/spans",
        "OTEL_BSP_SCHEDULE_DELAY": "200",  # ship spans within 0.2 s: the test waits for them
    }


@pytest.fixture
def traced(settings, spawn, zipkin, monkeypatch):
    """Config server, shards s0 and s1 and a router, each its own process exporting to Zipkin
    under its own service name; the CLI (`cli()`) exports too."""
    env = exporting_env(zipkin)
    for k, v in env.items():
        monkeypatch.setenv(k, v)  # the CLI's child processes
    procs = {"config": spawn(settings, "services.config", ready_name="config", env=env)}
    procs["config"].wait_ready(role="active")
    for sid in ("s0", "s1"):
        procs[sid] = spawn(settings, "services.shard", "--shard-id", sid, ready_name=f"shard-{sid}", env=env)
    procs["router"] = spawn(settings, "services.router", ready_name="router", env=env)
    for name, p in procs.items():
        p.wait_ready(role="active" if name != "router" else None)
    for sid in ("s0", "s1"):
        added = cli(settings, "add-shard", sid)
        assert added.returncode == 0, added.stdout + added.stderr
    sharded = cli(settings, "shard-collection", NS, "--key", '{"k": 1}')
    assert sharded.returncode == 0, sharded.stdout + sharded.stderr
    return procs


def owner_of(settings, ns: str) -> list[dict]:
    st = cli(settings, "status", "--verbose", "--json")
    assert st.returncode == 0, st.stdout + st.stderr
    return json.loads(st.stdout)


def find_trace(zipkin: str, service: str, span_name: str, what: str) -> list[dict]:
    """The newest trace of `service` with a span named `span_name`, waited for."""

    def look():
        q = f"/api/v2/traces?serviceName={service}&spanName={urllib.request.quote(span_name)}&limit=10"
        traces = api(zipkin, q)
        return traces[0] if traces else None

    return wait_until(
        look,
        30,
        f"Zipkin to hold {what} (service {service}, span {span_name!r})",
        interval=0.3,
        detail=lambda: (
            f"services: {api(zipkin, '/api/v2/services')}; spans of {service}: "
            f"{api(zipkin, f'/api/v2/spans?serviceName={service}')}"
        ),
    )


def services_and_spans(trace: list[dict]) -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for span in trace:
        out.setdefault(span.get("localEndpoint", {}).get("serviceName", "?"), set()).add(span.get("name", ""))
    return out


def whole_trace(zipkin: str, trace_id: str, want: dict[str, set[str]]) -> list[dict]:
    """GET /api/v2/trace/{id}, once every service in `want` has shipped the spans named for it.

    A parent span (the donor's `migration donate`) ends, and so ships, after its children: waiting
    for each service's first span only would read the trace before the parent is in it.
    """

    def holds(t: list[dict]) -> bool:
        got = services_and_spans(t)
        return all(names <= got.get(service, set()) for service, names in want.items())

    return wait_until(
        lambda: (t := api(zipkin, f"/api/v2/trace/{trace_id}")) and holds(t) and t,
        30,
        f"trace {trace_id} to hold {want}",
        interval=0.3,
        detail=lambda: str(services_and_spans(api(zipkin, f"/api/v2/trace/{trace_id}"))),
    )


def check_in_browser(browser, screenshot, zipkin: str, trace_id: str, texts: list[str], label: str) -> None:
    """Zipkin's own page for the trace shows every one of `texts` (service and span names)."""
    browser.get(f"{zipkin}/zipkin/traces/{trace_id}")

    def shown():
        body = browser.find_element("tag name", "body").text.lower()
        return all(t.lower() in body for t in texts)

    try:
        wait_until(
            shown,
            30,
            f"Zipkin's page for trace {trace_id} to show {texts}",
            interval=0.3,
            detail=lambda: browser.find_element("tag name", "body").text[:3000],
        )
    finally:
        screenshot(label)


def test_an_insert_and_a_move_range_are_traces_in_zipkin_api_and_ui(settings, traced, zipkin, browser, screenshot):
    import pymongo

    cluster = settings.cluster
    # The collection's one chunk is on its primary shard; move [0, MaxKey) to the other one, so
    # the two shards own known halves: k < 0 on the donor, k >= 0 on the recipient.
    status = owner_of(settings, NS)
    donor = next(ch["shard"] for coll in status["collections"] if coll["ns"] == NS for ch in coll["chunks"])
    recipient = "s1" if donor == "s0" else "s0"
    moved = cli(
        settings, "move-range", NS, "--min", '{"k": 0}', "--max", '{"k": {"$maxKey": 1}}', "--to", recipient, "--json"
    )
    assert moved.returncode == 0, moved.stdout + moved.stderr

    # (b) the move-range: one trace from the CLI through the config server (and the shards: MOVE_SPANS).
    move_want = expected(MOVE_SPANS, cluster=cluster, donor=donor, recipient=recipient)
    move = find_trace(zipkin, "shardlog-cli", "shardlog move-range", "the move-range's trace")
    move_id = move[0]["traceId"]
    got = services_and_spans(whole_trace(zipkin, move_id, move_want))
    for service, names in move_want.items():
        assert names <= got[service], f"{service}: want {names}, the trace has {got}"

    # (a) a known insert through pymongo: its trace holds the router and the owning shard only.
    uri = traced["router"].ready_info()["uri"]
    with pymongo.MongoClient(uri, serverSelectionTimeoutMS=10_000) as client:
        client["app"]["traced"].insert_one({"_id": "known", "k": 7})
        assert client["app"]["traced"].find_one({"_id": "known"})["k"] == 7
    insert_want = expected(INSERT_SPANS, cluster=cluster, owner=recipient)
    owner_span = f"shard-{recipient} insert"
    insert = find_trace(zipkin, f"shardlog-shard-{recipient}", owner_span, "the insert's trace")
    insert_id = insert[0]["traceId"]
    got = services_and_spans(whole_trace(zipkin, insert_id, insert_want))
    assert f"shardlog-shard-{donor}" not in got, f"the insert of k=7 reached {donor}, which does not own it: {got}"
    for service, names in insert_want.items():
        assert names <= got[service], f"{service}: want {names}, the trace has {got}"

    # (c) the same two traces on Zipkin's own pages in a real browser.
    check_in_browser(browser, screenshot, zipkin, insert_id, [*insert_want, owner_span], "insert")
    check_in_browser(
        browser, screenshot, zipkin, move_id, [*move_want, "config moverange", "migration clone"], "move-range"
    )


def test_a_tracing_ui_that_is_down_costs_spans_never_writes_or_reads(settings, spawn):
    """Every service exports to a port nobody listens on: writes and reads are served all the
    same, and each service says it dropped spans (counted, a warning a minute at most)."""
    import socket

    import pymongo

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = s.getsockname()[1]
    env = exporting_env(f"http://127.0.0.1:{closed}")
    procs = {"config": spawn(settings, "services.config", ready_name="config", env=env)}
    procs["config"].wait_ready(role="active")
    procs["s0"] = spawn(settings, "services.shard", "--shard-id", "s0", ready_name="shard-s0", env=env)
    procs["router"] = spawn(settings, "services.router", ready_name="router", env=env)
    for name, p in procs.items():
        p.wait_ready(role="active" if name != "router" else None)
    added = cli(settings, "add-shard", "s0")
    assert added.returncode == 0, added.stdout + added.stderr
    with pymongo.MongoClient(procs["router"].ready_info()["uri"], serverSelectionTimeoutMS=10_000) as client:
        coll = client["app"]["untraced"]
        assert coll.insert_many([{"_id": i, "v": i * i} for i in range(50)]).acknowledged
        assert coll.update_one({"_id": 7}, {"$set": {"v": -1}}).modified_count == 1
        assert sorted((d["_id"], d["v"]) for d in coll.find({"_id": {"$lt": 9}})) == [
            (i, -1 if i == 7 else i * i) for i in range(9)
        ]
    for name in ("shard-s0", "router"):
        p = procs["s0" if name == "shard-s0" else "router"]
        wait_until(
            lambda p=p: "spans dropped" in p.tail(400),
            30,
            f"{name} to report the spans Zipkin at port {closed} did not take",
            detail=p.tail,
        )
    assert all(p.proc.poll() is None for p in procs.values()), "a service stopped"


def test_make_up_starts_zipkin_and_its_services_export_to_it(bootstrap, tmp_path):
    """`make up` (infra.cluster up) starts Zipkin, prints its UI's URL, and the services it starts
    export to it; `make status` shows it; `make down` stops it."""
    import os
    import re
    import uuid

    env = {**os.environ, "KAFKA_BOOTSTRAP": bootstrap, "PYTHONPATH": str(ROOT), "OTEL_BSP_SCHEDULE_DELAY": "200"}
    env.pop("OTEL_TRACES_EXPORTER", None)
    data, cluster = tmp_path / "cluster", f"zk{uuid.uuid4().hex[:8]}"

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "infra.cluster", *args, "--data", str(data)],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
        )

    try:
        up = run("up", "--cluster", cluster)
        assert up.returncode == 0, up.stdout + up.stderr
        url = re.search(r"Traces \(Zipkin\): (http://127\.0\.0\.1:(\d+)/zipkin/)", up.stdout)
        assert url, up.stdout
        base = f"http://127.0.0.1:{url.group(2)}"
        # The shell line it suggests makes the CLI's commands traces in the same Zipkin.
        assert f"OTEL_TRACES_EXPORTER=zipkin OTEL_EXPORTER_ZIPKIN_ENDPOINT={base}/api/v2/spans" in up.stdout, up.stdout
        with urllib.request.urlopen(url.group(1), timeout=10) as page:
            assert page.status == 200
        status = json.loads(run("status", "--json").stdout)
        assert status["zipkin"]["running"] and status["zipkin"]["ui"] == url.group(1), status
        # make up's add-shard commands were work for the config server: its spans reach Zipkin.
        wait_until(
            lambda: "shardlog-config" in api(base, "/api/v2/services"),
            30,
            "the config server's spans in make up's Zipkin",
            interval=0.3,
            detail=lambda: str(api(base, "/api/v2/services")),
        )
        zipkin_pid = status["zipkin"]["pid"]
    finally:
        down = run("down")
    assert down.returncode == 0, down.stdout + down.stderr
    assert "local zipkin: stopped" in down.stdout, down.stdout
    assert not os.path.exists(f"/proc/{zipkin_pid}") or open(f"/proc/{zipkin_pid}/stat").read().split()[2] == "Z"
