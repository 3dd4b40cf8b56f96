"""Durable scheduler vs APScheduler 3 in memory: `.venv/bin/python -m bench.scheduler [--schedules N] [--window S]`.

N per-minute schedules (default 20,000) spread evenly over the minute, scripted profile. For each store
(PostgreSQL, SQLite) the hub's firing loop runs alone in this process for the window (default 15 s):
each fire persists the firing, advances the rule, resolves admission again and admits a queued Task.
Fire lag = fired_at − nominal time; CPU = this process's CPU seconds over the window / firings (the
PostgreSQL server's own CPU is not counted). The peer is APScheduler 3's AsyncIOScheduler holding the
same N jobs in memory whose job admits the same Task through TaskService.submit (SQLite). Prints figures.
"""
from __future__ import annotations

import argparse
import asyncio
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import sqlalchemy as sa

from bench.common import figure, pct, pg_database
from hub.app import Hub
from hub.clock import SystemClock
from hub.config import load_settings
from hub.runner import protocol as p
from hub.services.tasks import SubmitRequest
from hub.store.db import Database, upgrade
from hub.store.tables import firings, schedules

CAPS = {"platform": "linux", "engines": ["scripted"], "workspace_root": "/tmp", "workspace_writable": True}


async def _hub(url: str, home: Path) -> tuple[Hub, object]:
    await upgrade(url)
    settings = load_settings(env={}, home=str(home), database_url=url)
    settings.schedules.poll_s = 0.05
    hub = Hub(settings, Database(url), SystemClock())
    admin = await hub.auth.authenticate(await hub.auth.create_token("bench", admin=True))
    await hub.runtimes.register(admin, p.Register(name="r1", slots=8, capabilities=CAPS, running=[]))
    return hub, admin


async def durable(url: str, n: int, window: float) -> dict:
    """Run the firing loop alone over `n` spread per-minute schedules for `window` seconds."""
    home = Path(tempfile.mkdtemp(prefix="amux-bench-sched-"))
    hub, admin = await _hub(url, home)
    start = datetime.now(timezone.utc) + timedelta(seconds=3)
    step = 60.0 / n
    rows = []
    for i in range(n):
        nominal = start + timedelta(seconds=i * step)
        rows.append({"id": f"sch_{i:08d}", "creator_id": admin.principal_id, "provenance": {"source": "bench"},
                     "type": "subtask", "name": f"s{i}", "prompt": "say hi", "profile": "scripted", "rule": "every 1m",
                     "timezone": "UTC", "paused": False, "next_fire_at": nominal,
                     "created_at": nominal - timedelta(minutes=1), "updated_at": nominal})
    async with hub.db.write() as conn:
        for k in range(0, n, 2000):
            await conn.execute(schedules.insert(), rows[k:k + 2000])
    hub.loops.start("schedule-firing", hub.schedule_firing.firing_step, interval_s=hub.settings.schedules.poll_s,
                    wake=hub.schedule_firing.kicked)
    await asyncio.sleep(max(0.0, (start - datetime.now(timezone.utc)).total_seconds()))
    cpu0, fired0 = time.process_time(), hub.schedule_firing.fired
    await asyncio.sleep(window)
    cpu, fired = time.process_time() - cpu0, hub.schedule_firing.fired - fired0
    await hub.loops.stop()
    async with hub.db.read() as conn:
        got = (await conn.execute(sa.select(firings.c.nominal_time, firings.c.fired_at, firings.c.admission))).all()
    await hub.db.close()
    lags = [(r.fired_at - r.nominal_time).total_seconds() for r in got if r.admission != "missed"]
    return {"firings": fired, "missed": sum(1 for r in got if r.admission == "missed"),
            "ok": sum(1 for r in got if r.admission == "ok"), "p50": pct(lags, 50), "p99": pct(lags, 99),
            "cpu_per_firing": cpu / max(fired, 1)}


async def peer(n: int, window: float) -> dict:
    """APScheduler 3 AsyncIOScheduler with the same jobs in memory; each job admits the same Task."""
    from apscheduler.schedulers.asyncio import AsyncIOScheduler

    home = Path(tempfile.mkdtemp(prefix="amux-bench-peer-"))
    hub, admin = await _hub(f"sqlite+aiosqlite:///{home / 'peer.db'}", home)
    start = datetime.now(timezone.utc) + timedelta(seconds=5)
    step = 60.0 / n
    lags: list[float] = []
    req = SubmitRequest(prompt="say hi", profile="scripted", name="peer")

    async def job(i: int) -> None:
        nominal = start + timedelta(seconds=i * step)
        lags.append((datetime.now(timezone.utc) - nominal).total_seconds() % 60)
        await hub.tasks.submit(admin, req, origin="schedule")

    sched = AsyncIOScheduler(timezone=timezone.utc)
    for i in range(n):
        sched.add_job(job, "interval", minutes=1, start_date=start + timedelta(seconds=i * step), args=[i],
                      id=f"j{i}", misfire_grace_time=60, coalesce=True, max_instances=1)
    sched.start()
    await asyncio.sleep(max(0.0, (start - datetime.now(timezone.utc)).total_seconds()))
    cpu0, done0 = time.process_time(), len(lags)
    await asyncio.sleep(window)
    cpu, fired = time.process_time() - cpu0, len(lags) - done0
    sched.shutdown(wait=False)
    await hub.db.close()
    return {"firings": fired, "p50": pct(lags, 50), "p99": pct(lags, 99), "cpu_per_firing": cpu / max(fired, 1)}


async def main(n: int, window: float) -> None:
    """Print the figures."""
    print(f"bench/scheduler — {n} per-minute schedules spread over the minute, {window:.0f} s window per run, "
          "scripted profile")
    results = {}
    async with pg_database() as url:
        results["durable/PostgreSQL"] = await durable(url, n, window)
    tmp = Path(tempfile.mkdtemp(prefix="amux-bench-sqlite-"))
    results["durable/SQLite"] = await durable(f"sqlite+aiosqlite:///{tmp / 'bench.db'}", n, window)
    results["peer/APScheduler 3 (memory)"] = await peer(n, window)
    peer_r = results.pop("peer/APScheduler 3 (memory)")
    base = peer_r["cpu_per_firing"]
    figure("floor.scheduler.apscheduler3_cpu_us", f"floor: APScheduler 3 AsyncIOScheduler in memory, same Task "
           f"admission: firings={peer_r['firings']}  lag p50={peer_r['p50'] * 1000:.1f} ms  "
           f"p99={peer_r['p99'] * 1000:.1f} ms  CPU/firing={base * 1e6:.0f} µs", value=base * 1e6, unit="µs")
    for name, r in results.items():
        key = name.split("/")[1].lower()
        figure(f"scheduler.{key}.cpu_per_firing_us", f"{name:<20} firings={r['firings']:>6} ok={r['ok']} "
               f"missed={r['missed']}  CPU/firing={r['cpu_per_firing'] * 1e6:.0f} µs vs the peer's {base * 1e6:.0f} µs",
               value=r["cpu_per_firing"] * 1e6, unit="µs", ratio=r["cpu_per_firing"] / base, target="≤ 3",
               floor=base * 1e6)
        figure(f"scheduler.{key}.lag_p99_ms", f"{name:<20} fire lag p50={r['p50'] * 1000:.1f} ms  "
               f"p99={r['p99'] * 1000:.1f} ms (peer p99 {peer_r['p99'] * 1000:.1f} ms) against the 1 s bound",
               value=r["p99"] * 1000, unit="ms", ratio=r["p99"], target="≤ 1", p50=r["p50"] * 1000)


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING)  # before the hub's MCPServer would configure INFO (alembic's lines)
    logging.getLogger("apscheduler").setLevel(logging.CRITICAL)  # shutdown cancels in-flight peer jobs
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedules", type=int, default=20_000)
    ap.add_argument("--window", type=float, default=15.0)
    a = ap.parse_args()
    asyncio.run(main(a.schedules, a.window))
