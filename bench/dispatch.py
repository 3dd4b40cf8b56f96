"""bench/dispatch: scripted tasks over MCP to terminal on SQLite and PostgreSQL, against floors from the same run.

Run: `.venv/bin/python -m bench.dispatch [--tasks N]`. Prints figures; asserts nothing.

Floors (each in its own process, measured before our figures): the bare MCP SDK echo server (bench/bare_mcp.py,
logging at WARNING) — calls/s with the same 32 concurrent callers, p99 at the same offered 50 calls/s, and
sequential p50 — and PostgreSQL's single-row INSERT + COMMIT rate with asyncpg (1 and 32 connections).
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import time
from datetime import datetime
from pathlib import Path
from statistics import median
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import Implementation

from .common import BASE_REF, REPO, checkout, figure, hub_process, pct, pg_database
from .leases import bare_server, read_floor_line

CONCURRENCY = 32
RATE = 50
WARMUP = 64  # tasks run before the timed ones: the pool's connections opened, each statement compiled once


@contextlib.asynccontextmanager
async def client(url: str, token: str | None):
    """Connect the official MCP SDK client over one pooled HTTP client."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=120,
                                  limits=httpx2.Limits(max_connections=64, max_keepalive_connections=64)) as http:
        async with Client(streamable_http_client(f"{url}/mcp", http_client=http),
                          client_info=Implementation(name="bench", version="1"), cache=None) as c:
            yield c


async def throughput(url: str, token: str, n: int, concurrency: int = CONCURRENCY) -> float:
    """Submit n tasks over MCP with `concurrency` callers; return tasks/s from first submit to last terminal."""
    queue = list(range(n))
    scrape = {"Authorization": f"Bearer {token}"}  # an admin token opens /metrics when hub.metrics_token is unset
    async with httpx2.AsyncClient(timeout=60, headers=scrape) as http:
        before = terminal_counts((await http.get(f"{url}/metrics")).text)
    done_before, ok_before = sum(before.values()), before.get("succeeded", 0)
    async with client(url, token) as c:
        start = time.perf_counter()

        async def worker():
            while queue:
                queue.pop()
                await c.call_tool("task_submit", {"prompt": "say hi\nusage input=1 output=1", "profile": "scripted"})

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        async with httpx2.AsyncClient(timeout=60, headers=scrape) as http:
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
        pending = await _at_rate(c, "task_submit", {"prompt": "say hi", "profile": "scripted"}, rate, seconds)
        for res in await asyncio.gather(*pending):
            ids.append(res.structured_content["task_id"])
        await asyncio.sleep(0.5)
        lat = []
        for tid in ids:
            t = (await c.call_tool("task_get", {"task_id": tid})).structured_content
            while t["started_at"] is None:
                await asyncio.sleep(0.05)
                t = (await c.call_tool("task_get", {"task_id": tid})).structured_content
            started, created = datetime.fromisoformat(t["started_at"]), datetime.fromisoformat(t["created_at"])
            lat.append((started - created).total_seconds() * 1000)
    return pct(lat, 50), pct(lat, 99)


async def _at_rate(c: Client, tool: str, args: dict, rate: float, seconds: float, times: list | None = None) -> list:
    """Start one call every 1/rate seconds for `seconds`; return the tasks (appending each latency in ms to `times`)."""
    loop = asyncio.get_running_loop()
    start = loop.time()
    pending = []

    async def timed() -> object:
        t0 = time.perf_counter()
        res = await c.call_tool(tool, args)
        if times is not None:
            times.append((time.perf_counter() - t0) * 1000)
        return res

    for i in range(int(rate * seconds)):
        delay = start + i / rate - loop.time()
        if delay > 0:
            await asyncio.sleep(delay)
        pending.append(asyncio.create_task(timed()))
    return pending


async def echo_floor(url: str, calls: int) -> dict[str, float]:
    """The bare echo server: calls/s and p99 with CONCURRENCY callers, p99 at RATE calls/s, sequential p50/p99."""
    out: dict[str, float] = {}
    async with client(url, None) as c:
        for _ in range(50):
            await c.call_tool("echo", {"text": "hi"})
        left, times = calls, []

        async def caller() -> None:
            nonlocal left
            while left > 0:
                left -= 1
                t0 = time.perf_counter()
                await c.call_tool("echo", {"text": "hi"})
                times.append((time.perf_counter() - t0) * 1000)

        t0 = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(CONCURRENCY)))
        out["calls_per_s"] = calls / (time.perf_counter() - t0)
        out["concurrent_p99_ms"] = pct(times, 99)
        at_rate: list[float] = []
        await asyncio.gather(*await _at_rate(c, "echo", {"text": "hi"}, RATE, 6, at_rate))
        out["rate_p50_ms"], out["rate_p99_ms"] = pct(at_rate, 50), pct(at_rate, 99)
    return out


async def pg_commit_floor(url: str, seconds: float = 3.0) -> dict[int, float]:
    """PostgreSQL single-row INSERT + COMMIT per second with asyncpg (autocommit statements), 1 and 32 connections."""
    import asyncpg

    dsn = url.replace("postgresql+asyncpg://", "postgresql://")
    out = {}
    first = await asyncpg.connect(dsn)
    await first.execute("CREATE TABLE bench_floor (id bigserial PRIMARY KEY, v text NOT NULL)")
    await first.close()
    for n in (1, CONCURRENCY):
        conns = [await asyncpg.connect(dsn) for _ in range(n)]
        count = 0
        stop = time.monotonic() + seconds

        async def one(conn) -> None:
            nonlocal count
            while time.monotonic() < stop:
                await conn.execute("INSERT INTO bench_floor (v) VALUES ($1)", "x")
                count += 1

        await asyncio.gather(*(one(c) for c in conns))
        out[n] = count / seconds
        for c in conns:
            await c.close()
    return out


async def interleaved(url: str, token: str, bare: str, calls: int, rounds: int = 10,
                      bare_read: str | None = None) -> tuple[list, list, list]:
    """Time `profile_list` on the hub, the bare echo and (given `bare_read`) the bare echo reading PostgreSQL once,
    in alternating rounds (drift hits all); return ms lists."""
    ours: list[float] = []
    peer: list[float] = []
    read: list[float] = []
    async with client(url, token) as c, client(bare, None) as b, \
            (client(bare_read, None) if bare_read else contextlib.nullcontext(None)) as r:
        calls_of = [(c, "profile_list", {}, ours), (b, "echo", {"text": "hi"}, peer)]
        calls_of += [(r, "echo", {"text": "hi"}, read)] if r is not None else []
        for _ in range(20):
            for conn, tool, args, _ in calls_of:
                await conn.call_tool(tool, args)
        for _ in range(rounds):
            for conn, tool, args, out in calls_of:
                for _ in range(calls // rounds):
                    t0 = time.perf_counter()
                    res = await conn.call_tool(tool, args)
                    out.append((time.perf_counter() - t0) * 1000)
                    assert not res.is_error, res.content
    return ours, peer, read


async def one_build(repo: Path, db_url: str | None, label: str, bare: str, n: int) -> dict[str, Any]:
    """Run one build's hub (`amux up`, 8 slots) on `db_url` and take its figures: tasks/s, submit→running at
    RATE, and `profile_list` against the bare echo in alternating rounds."""
    async with hub_process(db_url, slots=8, profile_as=f"dispatch-{label}", repo=repo) as (url, token):
        await throughput(url, token, WARMUP)  # steady state, as the echo floor's own warm-up calls
        tps = await throughput(url, token, n)
        p50, p99 = await latency_at_rate(url, token, rate=RATE, seconds=6)
        async with (bare_server(db_url) if db_url else contextlib.nullcontext(None)) as bare_read:
            ours, peer, read = await interleaved(url, token, bare, 300, bare_read=bare_read)
    return {"tps": tps, "p50": p50, "p99": p99, "o50": pct(ours, 50), "o99": pct(ours, 99), "e50": pct(peer, 50),
            "e99": pct(peer, 99), "read": read}


async def main(n: int, echo_calls: int, against: str | None, rounds: int) -> None:
    """Per store: the floors, then our figures against them (each floor measured right before its figure); with
    `against`, that build's figures too, the two builds alternating `rounds` times on fresh databases."""
    base = checkout(against) if against else None
    if against and base is None:
        print(f"  (no build {against!r} in this clone: its side-by-side figures are skipped)")
    print(f"bench/dispatch — scripted tasks over MCP, hub + in-process runner with 8 slots in one subprocess; "
          f"{CONCURRENCY} concurrent callers; floor: bare MCP SDK echo server logging at WARNING"
          + (f"; build {against} side by side, {rounds} rounds each" if base else ""))
    builds = [("this", REPO)] + ([(str(against), base)] if base else [])
    async with bare_server() as bare:
        for label in ("sqlite", "postgresql"):
            if label == "postgresql":
                async with pg_database() as db_url:
                    pgf = await pg_commit_floor(db_url)
                figure("floor.pg.commits_per_s", f"floor: PostgreSQL single-row INSERT+COMMIT (asyncpg) "
                       f"{pgf[1]:.0f}/s on 1 connection, {pgf[CONCURRENCY]:.0f}/s on {CONCURRENCY}",
                       value=pgf[CONCURRENCY], unit="commits/s", one_connection=pgf[1])
            floor = await echo_floor(bare, echo_calls)
            figure(f"floor.{label}.echo_calls_per_s", f"floor: bare echo {floor['calls_per_s']:.0f} calls/s at "
                   f"{CONCURRENCY} callers (p99 {floor['concurrent_p99_ms']:.1f} ms); at {RATE} calls/s p50 "
                   f"{floor['rate_p50_ms']:.2f} ms, p99 {floor['rate_p99_ms']:.2f} ms",
                   value=floor["calls_per_s"], unit="calls/s", rate_p99_ms=floor["rate_p99_ms"])
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in builds}
            for _ in range(rounds if base else 1):
                for name, repo in builds:
                    async with (pg_database() if label == "postgresql" else contextlib.nullcontext(None)) as db_url:
                        runs[name].append(await one_build(repo, db_url, label, bare, n))
                    r = runs[name][-1]
                    if base:
                        share = r["tps"] / floor["calls_per_s"]
                        print(f"  {label:<10} [{name:>7}] {r['tps']:6.1f} tasks/s ({share:.2f} of echo); "
                              f"submit→running p50 {r['p50']:.1f} ms p99 {r['p99']:.1f} ms; profile_list "
                              f"p50 {r['o50']:.2f} ms = {r['o50'] / r['e50']:.2f}× echo", flush=True)
            ours = {k: median(x[k] for x in runs["this"]) for k in ("tps", "p50", "p99", "o50", "o99", "e50", "e99")}
            tps, p50, p99 = ours["tps"], ours["p50"], ours["p99"]
            figure(f"dispatch.{label}.tasks_per_s", f"{label:<10} dispatch {tps:6.1f} tasks/s ({n} tasks) vs bare echo "
                   f"{floor['calls_per_s']:.0f} calls/s", value=tps, unit="tasks/s",
                   ratio=tps / floor["calls_per_s"], target="≥ 0.25", floor=floor["calls_per_s"])
            if label == "postgresql":
                print(f"  {label:<10}   = one task per {pgf[CONCURRENCY] / tps:.1f} single-row commits' worth of "
                      f"PostgreSQL time (the floor above; #16 sets no target for this one)")
            figure(f"dispatch.{label}.submit_running_p99_ms", f"{label:<10} submit→running at {RATE} tasks/s: p50 "
                   f"{p50:.1f} ms, p99 {p99:.1f} ms vs bare echo p99 {floor['rate_p99_ms']:.2f} ms at {RATE} calls/s",
                   value=p99, unit="ms", ratio=p99 / floor["rate_p99_ms"], target="≤ 5", floor=floor["rate_p99_ms"],
                   p50=p50)
            o50, o99, p50_, p99_ = ours["o50"], ours["o99"], ours["e50"], ours["e99"]
            figure(f"mcp.{label}.profile_list_p50_ms", f"{label:<10} MCP per call: profile_list p50 {o50:.2f} ms "
                   f"(p99 {o99:.2f}) vs bare echo p50 {p50_:.2f} ms (p99 {p99_:.2f})", value=o50, unit="ms",
                   ratio=o50 / p50_, target="≤ 1.25", floor=p50_)
            if runs["this"][-1]["read"]:
                read_floor_line(label, runs["this"][-1]["read"], p50_, {"profile_list": o50})
            if base:
                theirs = {k: median(x[k] for x in runs[str(against)]) for k in ("tps", "p50", "o50", "e50")}
                rel_tps = ours["tps"] / floor["calls_per_s"] / (theirs["tps"] / floor["calls_per_s"])
                rel_call = (ours["o50"] / ours["e50"]) / (theirs["o50"] / theirs["e50"])
                figure(f"vs_base.{label}.tasks_per_s", f"{label:<10} vs {against}: dispatch {tps:.1f} vs "
                       f"{theirs['tps']:.1f} tasks/s (medians of {rounds} rounds each)", value=tps, unit="tasks/s",
                       ratio=rel_tps, target="≥ 0.9", floor=theirs["tps"])
                figure(f"vs_base.{label}.profile_list_vs_echo", f"{label:<10} vs {against}: profile_list "
                       f"{ours['o50'] / ours['e50']:.2f}× echo vs {theirs['o50'] / theirs['e50']:.2f}× echo",
                       value=ours["o50"] / ours["e50"], unit="× echo", ratio=rel_call, target="≤ 1.1",
                       floor=theirs["o50"] / theirs["e50"])
                figure(f"vs_base.{label}.submit_running_p50_ms", f"{label:<10} vs {against}: submit→running p50 at "
                       f"{RATE} tasks/s {p50:.1f} ms vs {theirs['p50']:.1f} ms", value=p50, unit="ms",
                       ratio=p50 / theirs["p50"], floor=theirs["p50"],
                       target="≤ 12 ms" if label == "sqlite" else None, met=p50 <= 12 if label == "sqlite" else None)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--tasks", type=int, default=600)
    ap.add_argument("--echo-calls", type=int, default=2000, help="calls for the bare echo throughput floor")
    ap.add_argument("--against", default=BASE_REF,
                    help=f"a git ref or source tree whose hub runs side by side (default {BASE_REF}; '' for none)")
    ap.add_argument("--rounds", type=int, default=2, help="rounds of each build when --against is set")
    a = ap.parse_args()
    asyncio.run(main(a.tasks, a.echo_calls, a.against or None, a.rounds))
