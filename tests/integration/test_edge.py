"""The edge, over real sockets: one client's idle connections cannot lock others out, every JSON door bounds
nesting, and malformed HTTP is answered 400 and logged once a minute per client, without a traceback."""
from __future__ import annotations

import asyncio
import json
import logging

import httpx2
import pytest

from tests.helpers import start_hub

OTHER = "127.0.0.2"  # a second client: Linux routes all of 127/8 to the loopback interface


async def connect(url: str, source: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = url.removeprefix("http://").split(":")
    return await asyncio.open_connection(host, int(port), local_addr=(source, 0))


async def closed(reader: asyncio.StreamReader, within: float) -> bool:
    """Return whether the server closed the connection within `within` seconds."""
    try:
        return await asyncio.wait_for(reader.read(), within) is not None
    except asyncio.TimeoutError:
        return False


async def raw_request(url: str, data: bytes, source: str = "127.0.0.1") -> bytes:
    """Send bytes over a fresh connection and return all the server answers before it closes."""
    reader, writer = await connect(url, source)
    writer.write(data)
    await writer.drain()
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return answer


async def test_one_clients_idle_connections_past_the_global_limit_do_not_lock_out_another_client(sqlite_url,
                                                                                                 tmp_path, clock):
    hub = await start_hub(sqlite_url, tmp_path, clock, header_timeout_s=30.0, max_pending_connections=50,
                          max_pending_per_client=20)
    conns = []
    try:
        for _ in range(80):  # more idle connections than the global limit, all from one address
            reader, writer = await connect(hub.url, OTHER)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finishes its head
            conns.append((reader, writer))
        shut = await asyncio.gather(*(closed(r, 2) for r, _ in conns))
        assert shut.count(True) == 60 and not any(shut[:20])  # past its 20, that client is closed at once
        async with httpx2.AsyncClient(timeout=5) as http:  # while another client is served as usual
            for _ in range(5):
                assert (await http.get(f"{hub.url}/healthz")).status_code == 200
        server = hub.site_runner.server
        assert server.pending_by_client[OTHER] == 20 and server.refused >= 60
    finally:
        for _, w in conns:
            w.close()
        await hub.stop()


async def test_one_client_may_hold_at_most_max_connections_per_client_open(sqlite_url, tmp_path, clock):
    hub = await start_hub(sqlite_url, tmp_path, clock, max_connections_per_client=5)
    conns = []
    try:
        for _ in range(5):
            reader, writer = await connect(hub.url, OTHER)
            writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            assert b" 200 " in await asyncio.wait_for(reader.readline(), 5)
            conns.append((reader, writer))
        reader, writer = await connect(hub.url, OTHER)
        conns.append((reader, writer))
        assert await closed(reader, 2)  # the sixth is closed at once
        async with httpx2.AsyncClient(timeout=5) as http:
            assert (await http.get(f"{hub.url}/healthz")).status_code == 200  # another address is not affected
        conns.pop()[1].close()
        conns.pop()[1].close()
        await asyncio.sleep(0.2)
        assert hub.site_runner.server.open_by_client[OTHER] == 4
        reader, writer = await connect(hub.url, OTHER)  # a closed one frees its place
        conns.append((reader, writer))
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        assert b" 200 " in await asyncio.wait_for(reader.readline(), 5)
    finally:
        for _, w in conns:
            w.close()
        await hub.stop()


def deep(n: int) -> str:
    return "[" * n + "]" * n


@pytest.mark.parametrize("path", ["/oauth/register", "/mcp", "/api/v1/tasks", "/oauth/token"])
async def test_json_nested_past_the_depth_limit_answers_400_naming_the_fix_on_every_route(hub, path, caplog):
    caplog.set_level(logging.ERROR)
    nested = json.dumps({"redirect_uris": ["http://127.0.0.1/cb"], "x": json.loads(deep(40))})
    async with httpx2.AsyncClient(timeout=10) as http:
        for body in (deep(100_000), nested):
            resp = await http.post(f"{hub.url}{path}", content=body, headers={
                "Content-Type": "application/json", "Authorization": f"Bearer {hub.admin_token}",
                "Accept": "application/json, text/event-stream"})
            assert resp.status_code == 400, (path, resp.status_code, resp.text[:300])
            data = resp.json()
            assert data["error"] == "invalid" and "nested more than 32 levels deep; flatten it" in data["fix"]
            assert data["request_id"] == resp.headers["X-Request-Id"]
    assert not caplog.records, caplog.text  # no 500, no logged failure


async def test_a_runner_frame_nested_past_the_depth_limit_is_refused_without_a_500(hub, caplog):
    caplog.set_level(logging.ERROR)
    from aiohttp import ClientSession, WSMsgType
    token = await hub.hub.auth.create_token("rt", admin=True, runner=True)
    async with ClientSession() as http:
        async with http.ws_connect(f"{hub.url}/runner/ws", headers={"Authorization": f"Bearer {token}"}) as ws:
            await ws.send_str(deep(100_000))
            msg = await asyncio.wait_for(ws.receive(), 5)
            assert msg.type == WSMsgType.TEXT and "nested more than 32 levels" in msg.data
    assert "RecursionError" not in caplog.text


GARBAGE = [b"\x16\x03\x01\x02\x00garbage\r\n\r\n", b"GET / HTTP/1.1\r\nBad Header Line\r\n\r\n",
           b"GET /healthz HTTP/9.9x\r\n\r\n"]


async def test_malformed_http_is_answered_400_and_logged_once_a_minute_per_client_without_a_traceback(
        hub, clock, caplog):
    caplog.set_level(logging.DEBUG)

    def lines() -> list[logging.LogRecord]:
        return [r for r in caplog.records if "malformed HTTP request" in r.getMessage()]

    for _ in range(3):
        for garbage in GARBAGE:
            answer = await raw_request(hub.url, garbage)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert head.startswith((b"HTTP/1.0 400 ", b"HTTP/1.1 400 ")), answer[:200]
            assert json.loads(body)["error"] == "malformed_request"
    assert len(lines()) == 1
    line = lines()[0]
    assert line.levelno == logging.WARNING and line.exc_info is None and "127.0.0.1" in line.getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info], caplog.text
    await raw_request(hub.url, GARBAGE[1], source=OTHER)  # another client gets its own line
    assert len(lines()) == 2 and OTHER in lines()[1].getMessage()
    clock.advance(59)
    await raw_request(hub.url, GARBAGE[1])
    assert len(lines()) == 2
    clock.advance(2)  # a minute after the first line: one more
    await raw_request(hub.url, GARBAGE[1])
    assert len(lines()) == 3
    async with httpx2.AsyncClient(timeout=5) as http:
        assert (await http.get(f"{hub.url}/healthz")).status_code == 200
