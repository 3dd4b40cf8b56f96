"""Durable scheduler vs APScheduler 3 with its SQLAlchemyJobStore on the same PostgreSQL:
`.venv/bin/python -m bench.scheduler [--schedules N] [--window S] [--no-sqlite]`.

N per-minute schedules (default 100,000, ~1,667 firings/s) spread evenly over the minute, scripted profile. Each
run is its own interpreter (its CPU and memory are its own) on a scratch database:
- durable/PostgreSQL (and durable/SQLite): the hub's firing loop alone; each fire persists the firing, advances
  the rule, resolves admission again and admits a queued Task.
- peer: APScheduler 3 `AsyncIOScheduler` with `SQLAlchemyJobStore` (psycopg) holding the same N jobs on PostgreSQL;
  each job admits the same Task through `TaskService.submit`, on the same PostgreSQL server.
Fire lag = when the firing's Task was committed − nominal time (both sides). CPU = the process's CPU seconds over
the window / firings in it (the PostgreSQL server's own CPU is not counted on either side). Memory = the hub
process's VmRSS with the N schedules loaded, before the window and after it.
"""
from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import sqlalchemy as sa

from bench.common import REPO, figure, pct, pg_database
from hub.app import Hub
from hub.clock import SystemClock
from hub.config_sources import load_settings
from hub.runner import protocol as p
from hub.services.tasks.service import SubmitRequest
from hub.store.db import Database, upgrade
from hub.store.tables import firings, schedules

CAPS = {"platform": "linux", "engines": ["scripted"], "workspace_root": "/tmp", "workspace_writable": True}
RESULT = "RESULT "  # a child's last stdout line: RESULT {json}


def rss_mib() -> tuple[float, float]:
    """Return this process's resident memory now and its peak (VmRSS, VmHWM) in MiB."""
    got = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, rest = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            got[key] = int(rest.split()[0]) / 1024
    return got.get("VmRSS", float("nan")), got.get("VmHWM", float("nan"))


async def _hub(url: str, home: Path) -> tuple[Hub, object]:
    await upgrade(url)
    settings = load_settings(env={}, home=str(home), database_url=url)
    settings.schedules.poll_s = 0.05
    # The durable side's one creator (a user) queues every firing's Task: a limit above the window's count keeps
    # the queue-limit check (its lock and count) on each firing without refusing any.
    settings.hub.max_queued_per_principal = 10_000_000
    if os.environ.get("AMUX_BENCH_FIRING_WORKERS"):
        settings.schedules.firing_workers = int(os.environ["AMUX_BENCH_FIRING_WORKERS"])
    hub = Hub(settings, Database(url), SystemClock())
    admin = await hub.auth.authenticate(await hub.auth.create_token("bench", admin=True))
    await hub.registry.register(admin, p.Register(name="r1", slots=8, capabilities=CAPS, running=[]))
    return hub, admin


def _lead(n: int, rows_per_s: float) -> float:
    """Seconds from now to the first nominal time: room to load `n` rows first (at `rows_per_s` on a busy machine),
    so the window opens on a loop that is not behind already."""
    return 3.0 + n / rows_per_s


async def durable(url: str, n: int, window: float) -> dict:
    """Run the firing loop alone over `n` spread per-minute schedules for `window` seconds."""
    home = Path(tempfile.mkdtemp(prefix="amux-bench-sched-"))
    hub, _ = await _hub(url, home)
    user = await hub.auth.authenticate(await hub.auth.create_token("bench-user"))  # not exempt from queue limits
    start = datetime.now(timezone.utc) + timedelta(seconds=_lead(n, 5000))
    step = 60.0 / n
    async with hub.db.write() as conn:
        for k in range(0, n, 5000):
            await conn.execute(schedules.insert(), [
                {"id": f"sch_{i:08d}", "creator_id": user.principal_id, "provenance": {"source": "bench"},
                 "type": "subtask", "name": f"s{i}", "prompt": "say hi", "profile": "scripted", "rule": "every 1m",
                 "timezone": "UTC", "paused": False, "next_fire_at": start + timedelta(seconds=i * step),
                 "created_at": start - timedelta(minutes=1), "updated_at": start}
                for i in range(k, min(n, k + 5000))])
    gc.collect()
    loaded = datetime.now(timezone.utc)
    lags: list[float] = []
    fire = hub.schedule_firing
    record = fire._record

    async def timed_record(due, now):  # when each firing's Task is committed
        await record(due, now)
        t = datetime.now(timezone.utc)
        lags.extend((t - d.nominal).total_seconds() for d in due if d.result and d.result[0] == "ok")

    fire._record = timed_record
    fire.start_loops(hub.loops)  # as the hub starts them (`schedules.firing_workers`)
    t0 = max(start, loaded) + timedelta(seconds=1)  # warm-up: the window opens once loading and a second are done
    if loaded > start:
        print(f"warning: loading ended {(loaded - start).total_seconds():.1f} s after the first nominal time",
              file=sys.stderr)
    await asyncio.sleep(max(0.0, (t0 - datetime.now(timezone.utc)).total_seconds()))
    rss_loaded, _ = rss_mib()
    cpu0, fired0, lag0 = time.process_time(), fire.fired, len(lags)
    await asyncio.sleep(window)
    cpu, fired, window_lags = time.process_time() - cpu0, fire.fired - fired0, lags[lag0:]
    rss_after, hwm = rss_mib()
    await hub.loops.stop()
    async with hub.db.read() as conn:
        got = (await conn.execute(sa.select(firings.c.admission, sa.func.count()).group_by(firings.c.admission))
               ).all()
        doubled = (await conn.execute(sa.select(sa.func.count()).select_from(
            sa.select(firings.c.schedule_id, firings.c.nominal_time).group_by(
                firings.c.schedule_id, firings.c.nominal_time).having(sa.func.count() > 1).subquery()))).scalar()
    await hub.db.close()
    by = {r[0]: r[1] for r in got}
    return {"firings": fired, "missed": by.get("missed", 0), "ok": by.get("ok", 0), "doubled": doubled,
            "p50": pct(window_lags, 50), "p99": pct(window_lags, 99), "cpu_per_firing": cpu / max(fired, 1), "cpu": cpu,
            "rss_loaded": rss_loaded, "rss_after": rss_after, "hwm": hwm}


@dataclass
class _Peer:
    hub: Hub
    admin: object
    start: datetime
    step: float
    req: SubmitRequest = field(default_factory=lambda: SubmitRequest(prompt="say hi", profile="scripted",
                                                                     name="peer"))
    lags: list[float] = field(default_factory=list)
    jobs: int = 0


_PEER: dict[str, _Peer] = {}  # the running peer's state, for its module-level job function


async def _peer_job(i: int) -> None:
    """APScheduler's job: admit the Task a firing admits; note when it was committed against its nominal time."""
    st = _PEER["run"]
    await st.hub.tasks.submit(st.admin, st.req, origin="schedule")
    late = (datetime.now(timezone.utc) - st.start).total_seconds() - i * st.step
    st.lags.append(late % 60)


def _load_jobs(sched, store, n: int, start: datetime, step: float) -> None:
    """Write the `n` jobs into the job store in bulk, each row as `SQLAlchemyJobStore.add_job` writes it."""
    import pickle

    from apscheduler.job import Job
    from apscheduler.triggers.interval import IntervalTrigger
    from apscheduler.util import datetime_to_utc_timestamp

    now = datetime.now(timezone.utc)
    for k in range(0, n, 5000):
        rows = []
        for i in range(k, min(n, k + 5000)):
            trig = IntervalTrigger(minutes=1, start_date=start + timedelta(seconds=i * step), timezone=timezone.utc)
            job = Job(sched, id=f"j{i}", func=_peer_job, trigger=trig, executor="default", args=(i,), kwargs={},
                      name=f"j{i}", misfire_grace_time=None, coalesce=True, max_instances=1,
                      next_run_time=trig.get_next_fire_time(None, now))
            rows.append({"id": job.id, "next_run_time": datetime_to_utc_timestamp(job.next_run_time),
                         "job_state": pickle.dumps(job.__getstate__(), store.pickle_protocol)})
        with store.engine.begin() as conn:
            conn.execute(store.jobs_t.insert(), rows)


def _watch(st: _Peer, t0: datetime, window: float) -> None:
    """Measure the peer's window from a thread, then print the figures and end the process.

    A thread, because a peer that falls behind holds the event loop: `_process_jobs` runs every due job's UPDATE
    and COMMIT synchronously, on a backlog that grows while it runs, so no `asyncio.sleep` would end on time.
    """
    time.sleep(max(0.0, (t0 - datetime.now(timezone.utc)).total_seconds()))
    rss_loaded, _ = rss_mib()
    cpu0, done0, jobs0 = time.process_time(), len(st.lags), st.jobs
    time.sleep(window)
    cpu, window_lags, jobs = time.process_time() - cpu0, st.lags[done0:], st.jobs - jobs0
    rss_after, hwm = rss_mib()
    print(RESULT + json.dumps({
        "firings": len(window_lags), "jobs": jobs, "p50": pct(window_lags, 50), "p99": pct(window_lags, 99),
        "cpu_per_firing": cpu / max(len(window_lags), 1), "cpu": cpu, "rss_loaded": rss_loaded,
        "rss_after": rss_after, "hwm": hwm}), flush=True)
    os._exit(0)  # no teardown: a peer that fell behind leaves thousands of job tasks


async def peer(url: str, n: int, window: float) -> None:
    """APScheduler 3 AsyncIOScheduler + SQLAlchemyJobStore (psycopg) on PostgreSQL; each job admits the same Task.
    `_watch` prints the figures and ends the process."""
    import threading

    from apscheduler.jobstores.sqlalchemy import SQLAlchemyJobStore
    from apscheduler.schedulers.asyncio import AsyncIOScheduler

    home = Path(tempfile.mkdtemp(prefix="amux-bench-peer-"))
    hub, admin = await _hub(url, home)
    start = datetime.now(timezone.utc) + timedelta(seconds=_lead(n, 2500))
    _PEER["run"] = st = _Peer(hub=hub, admin=admin, start=start, step=60.0 / n)
    store = SQLAlchemyJobStore(url=sa.engine.make_url(url).set(drivername="postgresql+psycopg"))
    update_job = store.update_job

    def counted_update(job):  # one per run the scheduler processed (submitted and advanced)
        st.jobs += 1
        update_job(job)

    store.update_job = counted_update
    sched = AsyncIOScheduler(timezone=timezone.utc, jobstores={"default": store})
    sched.start(paused=True)
    _load_jobs(sched, store, n, start, st.step)
    gc.collect()
    loaded = datetime.now(timezone.utc)
    sched.resume()
    t0 = max(start, loaded) + timedelta(seconds=1)
    if loaded > start:
        print(f"warning: loading ended {(loaded - start).total_seconds():.1f} s after the first nominal time",
              file=sys.stderr)
    threading.Thread(target=_watch, args=(st, t0, window), daemon=True).start()
    await asyncio.sleep(3600)


async def _child(kind: str, url: str, n: int, window: float) -> dict:
    """Run one measurement in a fresh interpreter; return its figures."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "bench.scheduler", "--run", kind, "--url", url, "--schedules", str(n),
        "--window", str(window), cwd=REPO, stdout=asyncio.subprocess.PIPE,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    out, _ = await proc.communicate()
    lines = [x for x in out.decode().splitlines() if x.startswith(RESULT)]
    if proc.returncode or not lines:
        raise RuntimeError(f"bench.scheduler --run {kind} failed ({proc.returncode}): {out.decode()[-2000:]}")
    return json.loads(lines[-1][len(RESULT):])


def _mib(r: dict) -> str:
    return f"{r['rss_loaded']:.0f} MiB loaded, {r['rss_after']:.0f} MiB after the window (peak {r['hwm']:.0f} MiB)"


async def main(n: int, window: float, sqlite: bool, peer_n: int) -> None:
    """Run each side in its own interpreter and print the figures."""
    print(f"bench/scheduler — {n} per-minute schedules spread over the minute ({n / 60:.0f} firings/s), "
          f"{window:.0f} s window per run, scripted profile; peer: APScheduler 3 AsyncIOScheduler + "
          "SQLAlchemyJobStore (psycopg) on the same PostgreSQL", flush=True)
    results = {}
    async with pg_database() as url:
        results["durable/PostgreSQL"] = await _child("durable", url, n, window)
    async with pg_database() as url:
        peer_same = await _child("peer", url, n, window)
    async with pg_database() as url:
        peer_r = await _child("peer", url, peer_n, window) if peer_n != n else peer_same
    if sqlite:
        tmp = Path(tempfile.mkdtemp(prefix="amux-bench-sqlite-"))
        results["durable/SQLite"] = await _child("durable", f"sqlite+aiosqlite:///{tmp / 'bench.db'}", n, window)
    due = window * n / 60
    figure("scheduler.apscheduler3_sqlalchemy.same_load_firings",
           f"peer at {n} schedules: of ~{due:.0f} runs due in the window APScheduler 3 + SQLAlchemyJobStore "
           f"advanced {peer_same['jobs']} and admitted {peer_same['firings']} Tasks (lag p50="
           f"{peer_same['p50'] * 1000:.0f} ms  p99={peer_same['p99'] * 1000:.0f} ms), process CPU "
           f"{peer_same['cpu'] / window * 100:.0f} % of a core",
           value=peer_same["firings"], unit="firings", due=due)
    base = peer_r["cpu_per_firing"]
    figure("floor.scheduler.apscheduler3_sqlalchemy_cpu_us",
           f"floor: peer at {peer_n} schedules ({peer_n / 60:.0f} firings/s, a load it keeps up with): "
           f"firings={peer_r['firings']} of ~{window * peer_n / 60:.0f} due  lag p50={peer_r['p50'] * 1000:.1f} ms  "
           f"p99={peer_r['p99'] * 1000:.1f} ms  "
           f"CPU/firing={base * 1e6:.0f} µs  memory {_mib(peer_r)}", value=base * 1e6, unit="µs")
    for name, r in results.items():
        key = name.split("/")[1].lower()
        pg = key == "postgresql"
        figure(f"scheduler.{key}.cpu_per_firing_us", f"{name:<20} firings={r['firings']:>6} ok={r['ok']} "
               f"missed={r['missed']} doubled={r['doubled']}  CPU/firing={r['cpu_per_firing'] * 1e6:.0f} µs vs the "
               f"peer's {base * 1e6:.0f} µs", value=r["cpu_per_firing"] * 1e6, unit="µs",
               ratio=r["cpu_per_firing"] / base, target="≤ 1" if pg else None, floor=base * 1e6)
        figure(f"scheduler.{key}.lag_p99_ms", f"{name:<20} fire lag p50={r['p50'] * 1000:.1f} ms  "
               f"p99={r['p99'] * 1000:.1f} ms against the 1 s bound", value=r["p99"] * 1000, unit="ms",
               ratio=r["p99"], target="≤ 1" if pg else None, p50=r["p50"] * 1000)
        if pg:
            figure("scheduler.postgresql.rss_mib", f"{name:<20} hub memory with {n} schedules: {_mib(r)}",
                   value=r["rss_after"], unit="MiB", loaded=r["rss_loaded"], peak=r["hwm"])


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING)  # before the hub's MCPServer would configure INFO (alembic's lines)
    logging.getLogger("apscheduler").setLevel(logging.CRITICAL)  # shutdown cancels in-flight peer jobs
    ap = argparse.ArgumentParser()
    ap.add_argument("--schedules", type=int, default=100_000)
    ap.add_argument("--window", type=float, default=20.0)
    ap.add_argument("--no-sqlite", dest="sqlite", action="store_false", help="PostgreSQL only")
    ap.add_argument("--peer-schedules", type=int, default=2_000, help="the peer's load for its CPU per firing")
    ap.add_argument("--run", choices=["durable", "peer"], help=argparse.SUPPRESS)  # one side, in this interpreter
    ap.add_argument("--url", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.run:
        fn = durable if a.run == "durable" else peer

        async def _one() -> None:
            print(RESULT + json.dumps(await fn(a.url, a.schedules, a.window)), flush=True)
            os._exit(0)  # a peer that fell behind leaves thousands of job tasks: no teardown to wait for

        asyncio.run(_one())
    else:
        asyncio.run(main(a.schedules, a.window, a.sqlite, a.peer_schedules))
