"""Slow and idle clients: request heads and bodies have deadlines, waiting connections are capped, silent runner
sockets are closed; the hub keeps answering everyone else meanwhile."""
from __future__ import annotations

import asyncio
import time

import httpx2
from aiohttp import ClientSession, WSMsgType

from tests.helpers import start_hub


async def healthz_ms(url: str) -> float:
    async with httpx2.AsyncClient(timeout=5) as http:
        start = time.perf_counter()
        assert (await http.get(f"{url}/healthz")).status_code == 200
        return (time.perf_counter() - start) * 1000


async def closed(reader: asyncio.StreamReader, within: float) -> bool:
    """Return whether the server closed the connection within `within` seconds."""
    try:
        return await asyncio.wait_for(reader.read(), within) is not None
    except asyncio.TimeoutError:
        return False


async def open_slowloris(url: str, n: int) -> list[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    host, port = url.removeprefix("http://").split(":")
    conns = []
    for _ in range(n):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")  # never finishes its head
        conns.append((reader, writer))
    return conns


async def test_slowloris_connections_are_closed_after_the_header_timeout_and_the_hub_stays_responsive(sqlite_url,
                                                                                                      tmp_path, clock):
    # one address opens them all: the per-client limit (tests/integration/test_edge.py) is off to reach the global one
    hub = await start_hub(sqlite_url, tmp_path, clock, header_timeout_s=1.0, max_pending_per_client=0,
                          max_connections_per_client=0)
    try:
        conns = await open_slowloris(hub.url, 400)
        for _, writer in conns[:50]:  # trickle a byte now and then: still no finished head
            writer.write(b"X")
        assert min([await healthz_ms(hub.url) for _ in range(5)]) < 100
        results = await asyncio.gather(*(closed(r, 10) for r, _ in conns))
        assert all(results), f"{results.count(False)} slow connections still open"
        assert min([await healthz_ms(hub.url) for _ in range(5)]) < 100
    finally:
        await hub.stop()


async def test_connections_waiting_for_a_request_head_are_capped(sqlite_url, tmp_path, clock):
    hub = await start_hub(sqlite_url, tmp_path, clock, max_pending_connections=50, header_timeout_s=30.0,
                          max_pending_per_client=0)
    try:
        conns = await open_slowloris(hub.url, 120)
        await asyncio.sleep(0.5)
        refused = sum(await asyncio.gather(*(closed(r, 2) for r, _ in conns)))
        assert refused >= 70  # past the cap, new connections are closed at once
        for _, w in conns:
            w.close()
        await asyncio.sleep(0.2)
        assert (await healthz_ms(hub.url)) < 1000  # the hub answers once they are gone
    finally:
        await hub.stop()


async def test_a_body_slower_than_the_body_timeout_answers_408(sqlite_url, tmp_path, clock):
    hub = await start_hub(sqlite_url, tmp_path, clock, body_timeout_s=1.0)
    try:
        host, port = hub.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /api/v1/tasks HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Authorization: Bearer " + hub.admin_token.encode() + b"\r\nContent-Length: 1000000\r\n\r\n{")
        await writer.drain()
        status = await asyncio.wait_for(reader.readline(), 10)
        assert b" 408 " in status
        writer.close()
    finally:
        await hub.stop()


async def test_an_idle_keep_alive_connection_is_closed_but_a_busy_one_serves_many_requests(sqlite_url, tmp_path, clock):
    hub = await start_hub(sqlite_url, tmp_path, clock, header_timeout_s=1.0)
    try:
        async with httpx2.AsyncClient(timeout=5) as http:  # one pooled connection, requests back to back
            for _ in range(20):
                assert (await http.get(f"{hub.url}/healthz")).status_code == 200
        host, port = hub.url.removeprefix("http://").split(":")
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        assert b" 200 " in await reader.readline()
        assert await closed(reader, 5)  # then silence: closed after the header timeout
    finally:
        await hub.stop()


async def test_a_runner_socket_that_sends_no_hello_is_closed(sqlite_url, tmp_path, clock):
    hub = await start_hub(sqlite_url, tmp_path, clock)
    hub.hub.runner_endpoint.hello_timeout_s = 0.5
    try:
        token = await hub.hub.auth.create_token("rt", admin=True, runner=True)
        async with ClientSession() as http:
            async with http.ws_connect(f"{hub.url}/runner/ws", headers={"Authorization": f"Bearer {token}"}) as ws:
                msg = await asyncio.wait_for(ws.receive(), 5)
                if msg.type == WSMsgType.TEXT:  # the refusal names the fix, then the close follows
                    assert "register" in msg.data or "upgrade" in msg.data
                    msg = await asyncio.wait_for(ws.receive(), 5)
                assert msg.type in (WSMsgType.CLOSE, WSMsgType.CLOSED, WSMsgType.CLOSING)
    finally:
        await hub.stop()
