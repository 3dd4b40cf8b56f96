"""bench/leases: a lease-gated MCP call against a bare MCP SDK echo tool, the Boxes page at 1,000 tasks × 3 boxes,
and what a sandboxed box costs: creating one, and `rift_vm_exec` of `true` against running `true` directly.

Run: `.venv/bin/python -m bench.leases [--calls N] [--no-pg] [--loads N] [--boxes-only]`. Prints figures;
asserts nothing.

Both MCP servers run in their own subprocess (the hub as `amux hub serve`, the peer under uvicorn, both
stateless with JSON responses); one client process calls them in alternating rounds so drift hits both.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import AsyncIterator

import httpx2
import sqlalchemy as sa
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import Implementation
from sqlalchemy.ext.asyncio import create_async_engine

from .common import ONE_ADDRESS, figure

REPO = Path(__file__).resolve().parent.parent
PG_URL = os.environ.get("AMUX_TEST_DATABASE_URL") or "postgresql+asyncpg://postgres@127.0.0.1:5432/test"


PIDS: dict[str, int] = {}  # server URL -> its process, for the CPU it spends per request


def cpu_s(url: str) -> float:
    """Return the CPU seconds (user + system, all threads) the server at `url` has used; NaN off Linux."""
    try:
        fields = Path(f"/proc/{PIDS[url]}/stat").read_text().rsplit(")", 1)[1].split()
    except (KeyError, OSError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def free_port() -> int:
    """Return a free TCP port on 127.0.0.1."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values: list[float], q: float) -> float:
    """Return the q-th percentile (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))] if ordered else float("nan")


async def _wait_http(url: str, proc: asyncio.subprocess.Process, ready) -> None:
    deadline = time.monotonic() + 60
    async with httpx2.AsyncClient() as http:
        while True:
            try:
                if await ready(http):
                    return
            except httpx2.TransportError:
                pass
            if time.monotonic() > deadline or proc.returncode is not None:
                err = (await proc.stderr.read()).decode()[-2000:] if proc.stderr else ""
                raise RuntimeError(f"{url} did not start: {err}")
            await asyncio.sleep(0.05)


@contextlib.asynccontextmanager
async def subprocess(args: list[str], env: dict[str, str]) -> AsyncIterator[asyncio.subprocess.Process]:
    """Run a Python module in a subprocess and terminate it afterwards."""
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", *args, cwd=REPO, env={**os.environ, **env},
                                                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), 10)
        except asyncio.TimeoutError:
            proc.kill()
            await proc.wait()


@contextlib.asynccontextmanager
async def hub_server(db_url: str | None) -> AsyncIterator[tuple[str, str, str]]:
    """Run `amux hub serve`; yield (url, admin token, database url)."""
    home = Path(tempfile.mkdtemp(prefix="amux-bench-leases-"))
    port = free_port()
    db = db_url or f"sqlite+aiosqlite:///{home / 'amux.db'}"
    async with subprocess(["hub.cli", "hub", "serve", "--listen", f"127.0.0.1:{port}", "--db", db],
                          {"AMUX_HOME": str(home), **ONE_ADDRESS}) as proc:
        url = f"http://127.0.0.1:{port}"
        PIDS[url] = proc.pid

        async def ready(http: httpx2.AsyncClient) -> bool:
            return (await http.get(f"{url}/readyz")).status_code == 200 and (home / "admin.token").exists()

        await _wait_http(url, proc, ready)
        yield url, (home / "admin.token").read_text().strip(), db


@contextlib.asynccontextmanager
async def bare_server(db_url: str | None = None) -> AsyncIterator[str]:
    """Run the bare SDK echo server (its echo reading PostgreSQL at `db_url` once a call, if given); yield its URL."""
    port = free_port()
    dsn = [db_url.replace("postgresql+asyncpg://", "postgresql://")] if db_url else []
    async with subprocess(["bench.bare_mcp", str(port), *dsn], {}) as proc:
        url = f"http://127.0.0.1:{port}"

        async def ready(http: httpx2.AsyncClient) -> bool:
            # A GET would open the server's event stream; a bodiless POST is answered at once.
            return (await http.post(f"{url}/mcp", content=b"")).status_code < 500

        await _wait_http(url, proc, ready)
        yield url


@contextlib.asynccontextmanager
async def client(url: str, token: str | None) -> AsyncIterator[Client]:
    """Connect the official MCP SDK client."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
        async with Client(streamable_http_client(f"{url}/mcp", http_client=http),
                          client_info=Implementation(name="bench", version="1")) as c:
            yield c


async def timed(c: Client, tool: str, args: dict, n: int) -> list[float]:
    """Return the latencies (ms) of n sequential calls."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        res = await c.call_tool(tool, args)
        out.append((time.perf_counter() - t0) * 1000)
        if res.is_error:
            raise RuntimeError(f"{tool} failed: {res.content[0].text}")
    return out


async def gated_vs_bare(url: str, token: str, bare: str, calls: int, rounds: int = 10,
                        bare_read: str | None = None) -> tuple[list[float], list[float], list[float], list[float]]:
    """Time `rift_vm_list` under a live handle, the bare echo, the hub's `profile_list` (the door, no lease) and,
    given `bare_read`, the bare echo that reads PostgreSQL once, in alternating rounds."""
    ours, peer, door, read = [], [], [], []
    async with client(url, token) as c, client(bare, None) as b, \
            (client(bare_read, None) if bare_read else contextlib.nullcontext(None)) as r:
        task = (await c.call_tool("rift_task_new", {"name": "bench"})).structured_content
        await c.call_tool("rift_vm_new", {"task": task["handle"], "name": "b1"})
        args = {"task": task["handle"]}
        await timed(c, "rift_vm_list", args, 50)
        await timed(b, "echo", {"text": "hi"}, 50)
        if r is not None:
            await timed(r, "echo", {"text": "hi"}, 50)
        for _ in range(rounds):
            ours += await timed(c, "rift_vm_list", args, calls // rounds)
            peer += await timed(b, "echo", {"text": "hi"}, calls // rounds)
            door += await timed(c, "profile_list", {}, calls // rounds // 2)
            if r is not None:
                read += await timed(r, "echo", {"text": "hi"}, calls // rounds // 2)
        checks = await client_checks([(c, "rift_vm_list", args), (c, "profile_list", {}), (b, "echo", {"text": "hi"})])
        print("  the official client checks each result against its tool's output schema (jsonschema): "
              + ", ".join(f"{tool} {us:.0f} µs" for tool, us in checks.items()) + " a call (in both p50s)", flush=True)
        await c.call_tool("rift_task_close", {"task": task["handle"]})
    return ours, peer, door, read


async def client_checks(calls: list[tuple[Client, str, dict]], n: int = 1000) -> dict[str, float]:
    """Return the µs the official Python client spends checking one result of each tool against its output schema.

    The SDK client validates every structured result with jsonschema (a compiled validator, `best_match` over
    `iter_errors`); this runs the same on a real result of each call, in this process, so the figure is the client's
    share of a call that the servers' p50s both include.
    """
    from jsonschema import exceptions
    from jsonschema.validators import validator_for

    out = {}
    for c, tool, args in calls:
        schema = next(t.output_schema for t in (await c.list_tools()).tools if t.name == tool)
        result = (await c.call_tool(tool, args)).structured_content
        check = validator_for(schema)(schema)
        best = float("inf")
        for _ in range(3):
            t0 = time.perf_counter()
            for _ in range(n):
                exceptions.best_match(check.iter_errors(result))
            best = min(best, (time.perf_counter() - t0) / n * 1e6)
        out[tool] = best
    return out


def read_floor_line(label: str, read: list[float], echo_p50: float, ours: dict[str, float]) -> None:
    """Print the floor of a call that reads PostgreSQL once beside the per-call figures (no target of its own)."""
    r50 = pct(read, 50)
    against = ", ".join(f"{name} {p50 / r50:.2f}×" for name, p50 in ours.items())
    print(f"  {label:<10}   floor: bare echo reading PostgreSQL once a call (one asyncpg SELECT) p50 {r50:.2f} ms = "
          f"{r50 / echo_p50:.2f}× the bare echo; against it: {against}", flush=True)


async def box_costs(url: str, token: str, boxes_n: int = 10, execs: int = 100) -> dict[str, list[float]]:
    """Time box creation and `true` in a box (over MCP, and through the driver alone) against `true` run directly.

    All in one run, interleaved, so machine load hits each the same.
    """
    from hub.boxes.local import LocalBoxDriver
    from hub.config import BoxSettings

    out: dict[str, list[float]] = {"create (rift_vm_new)": [], "rift_vm_exec true": [], "driver exec true": [],
                                   "driver create": [], "subprocess true": []}
    async with client(url, token) as c:
        task = (await c.call_tool("rift_task_new", {"name": "bench boxes"})).structured_content
        args = {"task": task["handle"]}
        made = []
        for _ in range(boxes_n):
            t0 = time.perf_counter()
            res = await c.call_tool("rift_vm_new", args)
            out["create (rift_vm_new)"].append((time.perf_counter() - t0) * 1000)
            if res.is_error:
                raise RuntimeError(res.content[0].text)
            made.append(res.structured_content["vm_id"])
        exec_args = {**args, "vm_id": made[0], "command": "true"}
        await timed(c, "rift_vm_exec", exec_args, 5)
        driver = LocalBoxDriver(Path(tempfile.mkdtemp(prefix="amux-bench-boxes-")), BoxSettings())
        t0 = time.perf_counter()
        handle = await driver.create("vm_benchdirect")
        out["driver create"].append((time.perf_counter() - t0) * 1000)
        try:
            for _ in range(execs // 10):
                out["rift_vm_exec true"] += await timed(c, "rift_vm_exec", exec_args, 10)
                for _ in range(10):
                    t0 = time.perf_counter()
                    await driver.exec(handle, "true", 10)
                    out["driver exec true"].append((time.perf_counter() - t0) * 1000)
                    t0 = time.perf_counter()
                    proc = await asyncio.create_subprocess_exec("true")
                    await proc.wait()
                    out["subprocess true"].append((time.perf_counter() - t0) * 1000)
        finally:
            await driver.destroy(handle)
            await c.call_tool("rift_task_close", args)
    return out


async def seed_boxes_page(db_url: str, tasks: int = 1000, per_task: int = 3) -> None:
    """Give the admin principal `tasks` open lease tasks with `per_task` live boxes each (rows only)."""
    engine = create_async_engine(db_url)
    from hub.store.tables import boxes, lease_tasks, principals

    now = datetime.now(timezone.utc)
    try:
        async with engine.begin() as conn:
            owner = (await conn.execute(sa.select(principals.c.id).where(principals.c.name == "admin"))).scalar_one()
            task_rows, box_rows = [], []
            for i in range(tasks):
                tid = f"task_b{i:07d}"
                at = now - timedelta(seconds=i * 7)
                task_rows.append(dict(id=tid, owner_id=owner, name=f"bench task {i} <&>", status="open",
                                      holder_label="mcp:Claude" if i % 2 else "mcp:Codex", holder_token_id=None,
                                      secret_hash="0" * 64, attached_at=at, last_activity_at=at, created_at=at))
                for j in range(per_task):
                    box_rows.append(dict(id=f"vm_b{i:07d}{j}", task_id=tid, name=f"box {j}", driver="local",
                                         state="live", handle={}, created_at=at))
            await conn.execute(lease_tasks.insert(), task_rows)
            await conn.execute(boxes.insert(), box_rows)
    finally:
        await engine.dispose()


async def boxes_page(url: str, token: str, n: int = 20, path: str = "/boxes") -> tuple[list[float], int, int]:
    """Time GET /boxes (or `path`); return latencies (ms), page bytes and rows shown."""
    times, size, rows = [], 0, 0
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"} if token else {}, timeout=60) as http:
        for i in range(n + 2):
            t0 = time.perf_counter()
            r = await http.get(f"{url}{path}")
            dt = (time.perf_counter() - t0) * 1000
            r.raise_for_status()
            if i >= 2:  # two warm-ups
                times.append(dt)
            size, rows = len(r.content), r.text.count("<tr data-")
    return times, size, rows


async def _get_ms(http: httpx2.AsyncClient, url: str, n: int) -> list[float]:
    """Return the latencies (ms) of n sequential GETs of `url` on one kept-alive client."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = await http.get(url)
        out.append((time.perf_counter() - t0) * 1000)
        r.raise_for_status()
    return out


@dataclass
class Series:
    """Latencies (ms) of one kind of load, and the CPU its server spent on them (s)."""

    ms: list[float] = field(default_factory=list)
    cpu_s: float = 0.0

    async def run(self, http: httpx2.AsyncClient, url: str, server: str, n: int) -> None:
        """Time n GETs of `url` and count the CPU the server at `server` spent meanwhile."""
        c0 = cpu_s(server)
        self.ms += await _get_ms(http, url, n)
        self.cpu_s += cpu_s(server) - c0

    def cpu_ms(self) -> float:
        """Return the server's CPU per load (ms): contention on a shared machine inflates it far less than latency."""
        return self.cpu_s / len(self.ms) * 1000 if self.ms else float("nan")


async def boxes_vs_bare(url: str, token: str, loads: int = 400,
                        rounds: int = 20) -> tuple[Series, Series, Series, int, int]:
    """Time `loads` GET /boxes with the bearer token, as many through the page's session cookie (a browser's
    path) and as many loads of a bare aiohttp page of the same size, in alternating rounds on kept-alive connections
    (so drift hits all three); return (hub, hub by cookie, bare, page bytes, rows shown)."""
    _, size, rows = await boxes_page(url, token, n=3)
    ours, by_cookie, floor = Series(), Series(), Series()
    async with bare_page(size) as bare_url, \
            httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=60) as hub_http, \
            httpx2.AsyncClient(timeout=60) as browser, httpx2.AsyncClient(timeout=60) as bare_http:
        signin = await browser.get(f"{url}/boxes", params={"token": token})  # 303 and the session cookie
        if signin.status_code != 303 or not browser.cookies:
            raise RuntimeError(f"/boxes?token= did not sign in: {signin.status_code}")
        await _get_ms(hub_http, f"{url}/boxes", 5)
        await _get_ms(browser, f"{url}/boxes", 5)
        await _get_ms(bare_http, f"{bare_url}/", 5)
        for _ in range(rounds):
            await ours.run(hub_http, f"{url}/boxes", url, loads // rounds)
            await by_cookie.run(browser, f"{url}/boxes", url, loads // rounds)
            await floor.run(bare_http, f"{bare_url}/", bare_url, loads // rounds)
    return ours, by_cookie, floor, size, rows


@contextlib.asynccontextmanager
async def bare_page(size: int) -> AsyncIterator[str]:
    """Run bench/bare_web.py (a bare aiohttp handler answering `size` bytes of HTML); yield its URL."""
    port = free_port()
    async with subprocess(["bench.bare_web", str(port), str(size)], {}) as proc:
        url = f"http://127.0.0.1:{port}"
        PIDS[url] = proc.pid

        async def ready(http: httpx2.AsyncClient) -> bool:
            return (await http.get(f"{url}/")).status_code == 200

        await _wait_http(url, proc, ready)
        yield url


@contextlib.asynccontextmanager
async def pg_database() -> AsyncIterator[str]:
    """Create a throwaway PostgreSQL database and drop it afterwards."""
    name = f"amux_bench_leases_{uuid.uuid4().hex[:8]}"
    base = sa.engine.make_url(PG_URL).set(drivername="postgresql+asyncpg")
    admin = create_async_engine(base, isolation_level="AUTOCOMMIT")
    async with admin.connect() as conn:
        await conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    try:
        yield base.set(database=name).render_as_string(hide_password=False)
    finally:
        async with admin.connect() as conn:
            await conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        await admin.dispose()


def _first_error(e: BaseException) -> BaseException:
    """Return the first leaf of an exception group (the error itself otherwise)."""
    while isinstance(e, BaseExceptionGroup):
        e = e.exceptions[0]
    return e


def _boxes_figure(label: str, ours: Series, by_cookie: Series, floor: Series, size: int, rows: int) -> None:
    """Print the Boxes page figure: its p99 against the bare page's, both from the same alternating rounds; and
    the same page loaded through its session cookie, and the CPU each server spent per load."""
    times = ours.ms
    f50, f99, o50, o99 = pct(floor.ms, 50), pct(floor.ms, 99), pct(times, 50), pct(times, 99)
    figure(f"boxes.{label}.page_p99_ms", f"{label:<10} GET /boxes with 1,000 tasks × 3 boxes: p50 "
           f"{o50:6.1f} ms  p99 {o99:6.1f} ms ({rows} rows, {size / 1024:.0f} KiB, {len(times)} loads) "
           f"vs a bare aiohttp page of the same size p50 {f50:.1f} ms  p99 {f99:.1f} ms "
           f"({len(floor.ms)} loads, alternating rounds; p50 ratio {o50 / f50:.2f})",
           value=o99, unit="ms", ratio=o99 / f99, target="≤ 5", floor=f99, p50=o50, bytes=size, rows=rows,
           cpu_ms=ours.cpu_ms(), floor_cpu_ms=floor.cpu_ms())
    c50, c99 = pct(by_cookie.ms, 50), pct(by_cookie.ms, 99)
    print(f"  {label:<10}   through its session cookie (a browser's path): p50 {c50:6.1f} ms  p99 {c99:6.1f} ms "
          f"({len(by_cookie.ms)} loads) = {c50 / f50:.2f}× / {c99 / f99:.2f}× the bare page", flush=True)
    print(f"  {label:<10}   server CPU per load: hub {ours.cpu_ms():.2f} ms (by cookie {by_cookie.cpu_ms():.2f} ms), "
          f"bare page {floor.cpu_ms():.2f} ms", flush=True)


async def main(calls: int, with_pg: bool, loads: int = 400, boxes_only: bool = False) -> None:
    print("bench/leases — hub (`amux hub serve`) and a bare MCP SDK echo server, each in its own process")
    stores = [("sqlite", contextlib.nullcontext(None))]
    if with_pg:
        stores.append(("postgresql", pg_database()))
    async with bare_server() as bare:
        for label, ctx in stores:
            try:
                async with ctx as db_url, hub_server(db_url) as (url, token, db):
                    if boxes_only:
                        await seed_boxes_page(db)
                        _boxes_figure(label, *await boxes_vs_bare(url, token, loads))
                        continue
                    async with (bare_server(db_url) if db_url else contextlib.nullcontext(None)) as bare_read:
                        ours, peer, door, read = await gated_vs_bare(url, token, bare, calls, bare_read=bare_read)
                    p50, p99, b50, b99 = pct(ours, 50), pct(ours, 99), pct(peer, 50), pct(peer, 99)
                    figure(f"leases.{label}.rift_vm_list_p50_ms", f"{label:<10} rift_vm_list (lease-gated) p50 "
                           f"{p50:6.2f} ms  p99 {p99:6.2f} ms | bare echo p50 {b50:6.2f} ms  p99 {b99:6.2f} ms "
                           f"({len(ours)} calls each; p99 ratio {p99 / b99:.2f})", value=p50, unit="ms",
                           ratio=p50 / b50, target="≤ 1.25", floor=b50)
                    print(f"  {label:<10}   of which the door (auth + bridge, no lease): profile_list p50 "
                          f"{pct(door, 50):6.2f} ms = {pct(door, 50) / b50:.2f}× bare; the lease gate adds "
                          f"{p50 - pct(door, 50):+.2f} ms at p50")
                    if read:
                        read_floor_line(label, read, b50, {"rift_vm_list": p50, "profile_list": pct(door, 50)})
                    if label == "sqlite":
                        try:
                            costs = await box_costs(url, token)
                        except (RuntimeError, BaseExceptionGroup) as e:  # the MCP client wraps it in a group
                            print(f"  {label:<10} boxes skipped: {_first_error(e)}")
                        else:
                            for what, ms in costs.items():
                                print(f"  {label:<10} {what:<22} p50 {pct(ms, 50):7.2f} ms  p99 {pct(ms, 99):7.2f} ms"
                                      f"  ({len(ms)} runs)")
                    await seed_boxes_page(db)
                    _boxes_figure(label, *await boxes_vs_bare(url, token, loads))
            except OSError as e:
                print(f"  {label:<10} skipped: {e}")
    from hub.web.boxes import render_page
    print("  (render only, no I/O:", _render_only(render_page), ")")


def _render_only(render_page) -> str:
    """Time the pure HTML rendering of 1,000 tasks × 3 boxes."""
    from hub.services.auth.service import Caller
    from hub.store.leases import PageBox, PageTask

    now = datetime.now(timezone.utc)
    tasks = [PageTask(f"task_{i:08d}", f"t{i}", "mcp:Claude", True, now, now) for i in range(1000)]
    boxes = [PageBox(f"vm_{i:08d}{j}", f"task_{i:08d}", None, "local", "live", now)
             for i in range(1000) for j in range(3)]
    caller = Caller("pr_x", "alice", "tok_x", "cli", False)
    t0 = time.perf_counter()
    for _ in range(10):
        render_page(caller, tasks, boxes, now, 14400)
    return f"{(time.perf_counter() - t0) * 100:.1f} ms per page"


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=600)
    ap.add_argument("--no-pg", action="store_true", help="skip PostgreSQL")
    ap.add_argument("--loads", type=int, default=400, help="Boxes page loads (and as many of the bare page)")
    ap.add_argument("--boxes-only", action="store_true", help="only the Boxes page figure")
    ns = ap.parse_args()
    asyncio.run(main(ns.calls, not ns.no_pg, ns.loads, ns.boxes_only))
