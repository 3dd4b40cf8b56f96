"""An operator's `X-Request-Id`, over real sockets: a well-formed one is the request's id in its answer, its access
line and the lines of the work it causes; a malformed or over-long one is replaced and never reaches a log line."""
from __future__ import annotations

import asyncio
import io
import json
import logging
import re
from typing import AsyncIterator, Iterator

import httpx2
import pytest
from aiohttp import web

from hub import logs
from hub.config import LogSettings
from hub.web.edge import edge_middleware
from tests.helpers import start_hub

FRESH = re.compile(r"[0-9a-f]{16}")
CAUSED: web.AppKey[list[asyncio.Task]] = web.AppKey("caused", list)


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    """Every log line, as the hub writes them (JSON), into a buffer; the logging set-up restored afterwards."""
    out = io.StringIO()
    root = logging.getLogger()
    level = root.level
    logs.configure(LogSettings(format="json", level="INFO"), stream=out)
    yield out
    for h in [h for h in root.handlers if getattr(h, "_amux_handler", False)]:
        root.removeHandler(h)
    root.setLevel(level)
    logging.getLogger(logs.ACCESS).setLevel(logging.NOTSET)


async def work(request: web.Request) -> web.Response:
    """Log a line while handling the request, and start work that logs after the answer went out."""
    log = logging.getLogger("amux.test")
    log.info("handling it")

    async def later() -> None:
        await asyncio.sleep(0.05)
        log.info("caused by it")

    request.app[CAUSED].append(asyncio.create_task(later()))
    return web.json_response({"ok": True})


@pytest.fixture
async def edge_app() -> AsyncIterator[tuple[str, web.Application]]:
    """The edge middleware in front of one route (`GET /work`), served with the hub's access log."""
    app = web.Application(middlewares=[edge_middleware()])
    app[CAUSED] = []
    app.router.add_get("/work", work)
    runner = web.AppRunner(app, access_log=logging.getLogger(logs.ACCESS), access_log_class=logs.AccessLog)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    yield f"http://127.0.0.1:{port}", app
    await runner.cleanup()


async def call(url: str, app: web.Application, sent: str | None) -> str:
    """GET /work with `sent` as X-Request-Id; return the answer's id once the work it caused has logged."""
    async with httpx2.AsyncClient(timeout=5) as http:
        resp = await http.get(f"{url}/work", headers={} if sent is None else {"X-Request-Id": sent})
    assert resp.status_code == 200
    await asyncio.gather(*app[CAUSED])
    app[CAUSED].clear()
    await asyncio.sleep(0.05)  # the access line follows the response by a moment
    return resp.headers["X-Request-Id"]


def records(out: io.StringIO) -> list[dict]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


@pytest.mark.parametrize("sent", ["4f0c9a1e-2b3d-5a67-9e2f-0123456789ab", "lb:req.42_Z", "x" * 128])
async def test_a_well_formed_id_names_the_answer_the_access_line_and_the_lines_of_what_it_causes(edge_app, log_lines,
                                                                                              sent):
    url, app = edge_app
    rid = await call(url, app, sent)
    assert rid == sent
    lines = records(log_lines)
    by_message = {r["message"]: r for r in lines if r["logger"] == "amux.test"}
    assert by_message["handling it"]["request_id"] == sent
    assert by_message["caused by it"]["request_id"] == sent
    access = [r for r in lines if r["logger"] == logs.ACCESS]
    assert len(access) == 1 and access[0]["request_id"] == sent and f"request_id={sent}" in access[0]["message"]


@pytest.mark.parametrize("sent", ["two words", "a;b", "crlf%0d%0aforged", "<script>", "x" * 129, "y" * 4000])
async def test_a_malformed_or_over_long_id_is_replaced_by_a_fresh_one_and_never_logged(edge_app, log_lines, sent):
    url, app = edge_app
    rid = await call(url, app, sent)
    assert FRESH.fullmatch(rid) and rid != sent
    lines = records(log_lines)
    assert {r["request_id"] for r in lines if r["logger"] in ("amux.test", logs.ACCESS)} == {rid}
    assert sent not in log_lines.getvalue()


async def test_no_id_sent_gets_a_fresh_one(edge_app, log_lines):
    url, app = edge_app
    rid = await call(url, app, None)
    assert FRESH.fullmatch(rid)
    assert {r["request_id"] for r in records(log_lines) if r["logger"] == logs.ACCESS} == {rid}


async def test_the_hubs_refusals_carry_the_operators_id_in_their_header_and_body(sqlite_url, tmp_path, clock):
    hub = await start_hub(sqlite_url, tmp_path, clock)
    try:
        async with httpx2.AsyncClient(timeout=5) as http:
            kept = await http.get(f"{hub.url}/api/v1/tasks", headers={"X-Request-Id": "proxy-7f3a"})
            replaced = await http.get(f"{hub.url}/api/v1/tasks", headers={"X-Request-Id": "proxy 7f3a"})
            healthy = await http.get(f"{hub.url}/healthz", headers={"X-Request-Id": "proxy-7f3b"})
        assert kept.status_code == 401
        assert kept.headers["X-Request-Id"] == kept.json()["request_id"] == "proxy-7f3a"
        assert replaced.status_code == 401 and FRESH.fullmatch(replaced.json()["request_id"])
        assert replaced.headers["X-Request-Id"] == replaced.json()["request_id"]
        assert healthy.status_code == 200 and healthy.headers["X-Request-Id"] == "proxy-7f3b"
    finally:
        await hub.stop()
