"""The dashboard's HTTP edge without a broker: the page and its own files, JSON errors in MongoDB's
shape for unknown paths and methods, and a snapshot that never fails as a whole (services that were
never reached show as unknown; a failing part shows as an error field)."""

from __future__ import annotations

import pytest
from aiohttp.test_utils import TestClient, TestServer

from libs.service import ServiceSettings
from services.dashboard import server, snapshot


@pytest.fixture
async def board(tmp_path):
    b = server.Dashboard(
        ServiceSettings("127.0.0.1:1", "demo", tmp_path), port=0, tracing_ui="http://zipkin:9411/zipkin"
    )
    yield b
    b.follower.store.close()


@pytest.fixture
async def client(board):
    async with TestClient(TestServer(board.app())) as c:
        yield c


async def test_the_page_and_its_files_are_ours(client):
    page = await client.get("/")
    html = await page.text()
    assert page.status == 200 and '<script src="/static/app.js">' in html and "http" not in html.split("<body")[1]
    for name, kind in (("app.js", "javascript"), ("style.css", "css")):
        r = await client.get(f"/static/{name}")
        assert r.status == 200 and kind in r.headers["Content-Type"], (name, r.headers)


async def test_unknown_paths_and_methods_answer_json_errors(client):
    r = await client.get("/nope")
    assert r.status == 404
    assert await r.json() == {"ok": 0, "errmsg": "no such page /nope", "code": 59, "codeName": "CommandNotFound"}
    r = await client.get("/static/../server.py")
    assert r.status in (403, 404) and (await r.json())["ok"] == 0
    r = await client.post("/api/snapshot", data=b"{}")
    assert r.status == 405 and (await r.json())["codeName"] == "IllegalOperation"


async def test_a_snapshot_with_nothing_reached_still_answers(client):
    r = await client.get("/api/snapshot")
    snap = await r.json()
    assert r.status == 200 and snap["cluster"] == "demo" and snap["shards"] == []
    assert snap["balancer"]["answering"] is False and snap["errors"]["balancer"].startswith("unknown")
    assert snap["figures"]["shards"] == {} and snap["tracing"] == "http://zipkin:9411/zipkin"


async def test_a_part_that_fails_is_an_error_field_not_a_500(client, monkeypatch):
    def broken(**kw):
        raise KeyError("lastRound")

    monkeypatch.setattr(snapshot, "assemble", broken)
    r = await client.get("/api/snapshot")
    assert r.status == 200 and (await r.json())["errors"] == {"snapshot": "KeyError: 'lastRound'"}


async def test_figures_that_raise_leave_the_page_up(board):
    class Broken:
        def last_minute(self):
            raise RuntimeError("window store closed")

    board.figures = Broken()
    assert board._figures()["error"] == "RuntimeError: window store closed"


def test_a_bad_port_setting_is_refused(monkeypatch):
    monkeypatch.setenv("SHARDLOG_DASHBOARD_PORT", "http")
    with pytest.raises(ValueError, match="SHARDLOG_DASHBOARD_PORT='http'"):
        server.dashboard_address()
    assert server.dashboard_address(0, "0.0.0.0") == ("0.0.0.0", 0)
