"""bench/dispatch: scripted tasks over MCP to terminal on SQLite and PostgreSQL, plus MCP per-call overhead.

Run: `.venv/bin/python -m bench.dispatch [--tasks N]`. Prints figures; asserts nothing.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from datetime import datetime

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import Implementation

from .common import REPO, free_port, hub_process, pct, pg_database


@contextlib.asynccontextmanager
async def client(url: str, token: str | None):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=120,
                                  limits=httpx2.Limits(max_connections=64, max_keepalive_connections=64)) as http:
        async with Client(streamable_http_client(f"{url}/mcp", http_client=http),
                          client_info=Implementation(name="bench", version="1"), cache=None) as c:
            yield c


async def throughput(url: str, token: str, n: int, concurrency: int = 32) -> float:
    """Submit n tasks over MCP with `concurrency` callers; return tasks/s from first submit to last terminal."""
    queue = list(range(n))
    ids: list[str] = []
    async with httpx2.AsyncClient(timeout=60) as http:
        before = terminal_counts((await http.get(f"{url}/metrics")).text)
    done_before, ok_before = sum(before.values()), before.get("succeeded", 0)
    async with client(url, token) as c:
        start = time.perf_counter()

        async def worker():
            while queue:
                queue.pop()
                res = await c.call_tool("task_submit", {"prompt": "say hi\nusage input=1 output=1", "profile": "scripted"})
                ids.append(res.structured_content["task_id"])

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        async with httpx2.AsyncClient(timeout=60) as http:
            while True:  # the hub's own gauges: cheap to read, and they count every task
                counts = terminal_counts((await http.get(f"{url}/metrics")).text)
                if sum(counts.values()) - done_before >= n:
                    break
                await asyncio.sleep(0.1)
        elapsed = time.perf_counter() - start
    if counts.get("succeeded", 0) - ok_before < n:
        print(f"    warning: {n - counts.get('succeeded', 0) + ok_before} tasks did not succeed", file=sys.stderr)
    return n / elapsed


def terminal_counts(metrics: str) -> dict[str, float]:
    """Read `amux_tasks{status=…}` for the terminal statuses from /metrics text."""
    out = {}
    for line in metrics.splitlines():
        for status in ("succeeded", "failed", "cancelled", "timed_out"):
            if line.startswith(f'amux_tasks{{status="{status}"}}'):
                out[status] = float(line.split()[-1])
    return out


async def latency_at_rate(url: str, token: str, rate: float, seconds: float) -> tuple[float, float]:
    """Submit at a fixed rate; return p50/p99 of submit→running in ms (server timestamps)."""
    ids: list[str] = []
    async with client(url, token) as c:
        loop = asyncio.get_running_loop()
        start = loop.time()
        pending = []
        for i in range(int(rate * seconds)):
            delay = start + i / rate - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            pending.append(asyncio.create_task(c.call_tool("task_submit", {"prompt": "say hi", "profile": "scripted"})))
        for res in await asyncio.gather(*pending):
            ids.append(res.structured_content["task_id"])
        await asyncio.sleep(0.5)
        lat = []
        for tid in ids:
            t = (await c.call_tool("task_get", {"task_id": tid})).structured_content
            while t["started_at"] is None:
                await asyncio.sleep(0.05)
                t = (await c.call_tool("task_get", {"task_id": tid})).structured_content
            lat.append((datetime.fromisoformat(t["started_at"]) - datetime.fromisoformat(t["created_at"])).total_seconds() * 1000)
    return pct(lat, 50), pct(lat, 99)


async def per_call(url: str, token: str | None, tool: str, args: dict, n: int) -> tuple[float, float]:
    """Return p50/p99 ms of sequential calls to one tool."""
    async with client(url, token) as c:
        for _ in range(20):
            await c.call_tool(tool, args)
        times = []
        for _ in range(n):
            t0 = time.perf_counter()
            res = await c.call_tool(tool, args)
            times.append((time.perf_counter() - t0) * 1000)
            assert not res.is_error, res.content
    return pct(times, 50), pct(times, 99)


@contextlib.asynccontextmanager
async def bare_server():
    """Run bench/bare_mcp.py under uvicorn in a subprocess."""
    port = free_port()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "bench.bare_mcp", str(port), cwd=REPO,
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        for _ in range(400):  # wait for the port (a GET on /mcp would open an endless SSE stream)
            try:
                _, writer = await asyncio.open_connection("127.0.0.1", port)
                writer.close()
                break
            except OSError:
                await asyncio.sleep(0.05)
        yield url
    finally:
        proc.terminate()
        await proc.wait()


async def main(n: int) -> None:
    print("bench/dispatch — scripted tasks over MCP, hub + in-process runner with 8 slots in one subprocess")
    for label, ctx in (("sqlite", contextlib.nullcontext(None)), ("postgresql", pg_database())):
        async with ctx as db_url:
            async with hub_process(db_url, slots=8) as (url, token):
                tps = await throughput(url, token, n)
                p50, p99 = await latency_at_rate(url, token, rate=50, seconds=6)
        print(f"  {label:<10} throughput {tps:7.1f} tasks/s ({n} tasks, 32 concurrent submitters; target ≥ 300)")
        print(f"  {label:<10} submit→running at 50 tasks/s: p50 {p50:.1f} ms, p99 {p99:.1f} ms (target p99 ≤ 50 ms)")
    async with hub_process(None, slots=8) as (url, token), bare_server() as bare:
        ours = await per_call(url, token, "profile_list", {}, 300)
        peer = await per_call(bare, None, "echo", {"text": "hi"}, 300)
    print(f"  MCP per-call: amux profile_list p50 {ours[0]:.2f} ms p99 {ours[1]:.2f} ms; "
          f"bare SDK echo p50 {peer[0]:.2f} ms p99 {peer[1]:.2f} ms; ratio p50 {ours[0] / peer[0]:.2f}× (target ≤ 1.5×)")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=600)
    asyncio.run(main(ap.parse_args().tasks))
