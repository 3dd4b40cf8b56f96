"""Real `amux hub serve` processes: two replicas on one PostgreSQL fire each nominal time exactly once;
kill -9 between persisting a firing and dispatching it (the test kills the process at that observed point) leaves
`unknown`, never a replay."""
from __future__ import annotations

import asyncio
import os
import sys
from collections import defaultdict
from datetime import timedelta
from pathlib import Path

import httpx2
import sqlalchemy as sa

from hub.app import Hub
from hub.runner import protocol as p
from hub.services.schedules.service import ScheduleSpec
from hub.store.db import Database
from hub.store.tables import firings, runtimes, schedules, task_runs
from tests.helpers import REPO, eventually, hub_settings, started
from tests.integration.test_replicas import free_port

CAPS = {"platform": "linux", "engines": ["scripted"], "workspace_root": "/tmp", "workspace_writable": True}
FAST = {"AMUX_HUB__POLL_S": "0.05", "AMUX_SCHEDULES__POLL_S": "0.05", "AMUX_SCHEDULES__RECONCILE_S": "0.1"}


async def serve(db_url: str, home: Path, **env: str) -> tuple[asyncio.subprocess.Process, str]:
    port = free_port()
    home.mkdir(parents=True, exist_ok=True)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hub.cli", "hub", "serve", "--db", db_url, "--listen", f"127.0.0.1:{port}",
        cwd=REPO, env={**os.environ, "AMUX_HOME": str(home), **FAST, **env},
        stdout=asyncio.subprocess.DEVNULL, stderr=open(home / "stderr.log", "wb"))  # noqa: SIM115
    return proc, f"http://127.0.0.1:{port}"


async def ready(url: str) -> bool:
    try:
        async with httpx2.AsyncClient() as http:
            return (await http.get(f"{url}/readyz")).status_code == 200
    except httpx2.TransportError:
        return False


async def _exists(path: Path) -> bool:
    return path.exists()


async def services(db_url: str, home: Path):
    """In-test services over the same database (creating definitions; no loops run here)."""
    hub = Hub(hub_settings(db_url, home), Database(db_url))
    caller = await hub.auth.authenticate(await hub.auth.create_token("alice"))
    admin = await hub.auth.authenticate(await hub.auth.create_token("root", admin=True))
    await hub.registry.register(admin, p.Register(name="r1", slots=2, capabilities=CAPS, running=[]))
    return hub, caller


async def test_two_hub_processes_on_one_postgresql_fire_each_nominal_time_of_500_schedules_exactly_once(pg_url,
                                                                                                        tmp_path):
    hub, alice = await services(pg_url, tmp_path / "test")
    procs = []
    try:
        for name in ("a", "b"):  # one after the other (simultaneous first starts: test_replicas.py)
            procs.append(await serve(pg_url, tmp_path / name))
            await started(lambda url=procs[-1][1]: ready(url), f"hub {name}", proc=procs[-1][0])
            await started(lambda h=tmp_path / name: _exists(h / "admin.token"), f"hub {name} admin token")
        async with hub.db.write() as conn:  # no runner: every fire is admitted as skipped:offline (no Task churn)
            await conn.execute(runtimes.update().values(status="offline"))
        for i in range(500):
            await hub.schedules.create(alice,
                                       ScheduleSpec(name=f"s{i}", prompt="say hi", rule="every 1s", profile="scripted"))
        await asyncio.sleep(6)
        async with hub.db.write() as conn:
            await conn.execute(schedules.update().values(paused=True))
        await asyncio.sleep(0.5)
        for proc, _ in procs:
            assert proc.returncode is None, "a replica died"
    finally:
        for proc, _ in procs:
            proc.kill()
            await proc.wait()
    async with hub.db.read() as conn:
        rows = (await conn.execute(sa.select(firings.c.schedule_id, firings.c.nominal_time, firings.c.admission,
                                             firings.c.missed_count))).all()
    await hub.db.close()
    per: dict[str, list] = defaultdict(list)
    for r in rows:
        per[r.schedule_id].append(r)
    assert len(per) == 500
    for sid, fs in per.items():
        fs.sort(key=lambda r: r.nominal_time)
        assert len({r.nominal_time for r in fs}) == len(fs)
        covered = sum(r.missed_count if r.admission == "missed" else 1 for r in fs)
        span = int((fs[-1].nominal_time - fs[0].nominal_time) / timedelta(seconds=1)) + 1
        assert covered == span, (sid, [(r.nominal_time, r.admission, r.missed_count) for r in fs])
    assert sum(len(fs) for fs in per.values()) >= 500 * 3
    for name in ("a", "b"):
        log = (tmp_path / name / "stderr.log").read_text()
        assert "schedule firing failed" not in log, log[-3000:]


async def _dispatch_waiting_on(conn, table: str) -> int:
    """How many other backends wait for a lock on `table` (the hub's dispatch reading it, held by our lock)."""
    return (await conn.execute(sa.text(
        "SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
        "WHERE c.relname = :t AND NOT l.granted AND l.pid <> pg_backend_pid()"), {"t": table})).scalar()


# Long by design: one kill-and-restart journey over real processes; the checks follow its order.
async def test_kill_9_between_persisting_a_firing_and_dispatching_it_leaves_unknown_not_replayed(pg_url, tmp_path):
    """The fault is injected here, at an observed point: the test holds a lock on `principals`, which dispatch reads
    first (it acts as the schedule's creator) and the firing's commit does not touch; once the committed firing is
    visible and the hub's dispatch waits on that lock, the hub is killed with SIGKILL."""
    hub, alice = await services(pg_url, tmp_path / "test")
    s = await hub.schedules.create(alice, ScheduleSpec(name="c", prompt="say hi", rule="every 1s", profile="scripted"))
    sid = s["schedule_id"]
    later = hub.clock.now() + timedelta(days=1)
    async with hub.db.write() as conn:  # not due until the hub is up and the lock is held
        await conn.execute(schedules.update().where(schedules.c.id == sid).values(next_fire_at=later))

    async def ledger():
        async with hub.db.read() as conn:
            return (await conn.execute(sa.select(firings).where(firings.c.schedule_id == sid)
                                       .order_by(firings.c.nominal_time))).all()

    async def committed_and_waiting():
        dispatched = [f for f in await ledger() if f.admission != "missed"]
        async with hub.db.read() as conn:
            waiting = await _dispatch_waiting_on(conn, "principals")
        return dispatched if dispatched and waiting else None

    proc, url = await serve(pg_url, tmp_path / "crash")
    lock_conn = await hub.db.engine.connect()
    try:
        await started(lambda: ready(url), "hub crash", proc=proc)
        await started(lambda: _exists(tmp_path / "crash" / "admin.token"), "hub crash admin token")  # startup is done
        lock = await lock_conn.begin()
        await lock_conn.execute(sa.text("LOCK TABLE principals IN ACCESS EXCLUSIVE MODE"))
        async with hub.db.write() as conn:
            await conn.execute(schedules.update().where(schedules.c.id == sid).values(next_fire_at=sa.func.now()))
        crashed = await eventually(committed_and_waiting, timeout=30)
        proc.kill()  # kill -9 after the commit, before the dispatch
        assert await asyncio.wait_for(proc.wait(), 30) == -9
        await lock.rollback()
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()
        await lock_conn.close()

    # The rule fires every second: on a slow machine a second firing can be persisted (and wait on the same lock)
    # before the kill. Every one persisted was never dispatched; the first is followed below.
    assert crashed and all(f.admission is None and f.task_id is None for f in crashed), crashed
    crashed = crashed[0]
    [now_crashed] = [f for f in await ledger() if f.id == crashed.id]
    assert now_crashed.admission is None and now_crashed.task_id is None  # the dispatch never happened
    async with hub.db.read() as conn:
        nxt = (await conn.execute(sa.select(schedules.c.next_fire_at).where(schedules.c.id == sid))).scalar()
    assert nxt > crashed.nominal_time  # the rule had already moved on

    proc, url = await serve(pg_url, tmp_path / "restart", AMUX_SCHEDULES__UNKNOWN_AFTER_S="1")
    try:
        async def unknown():
            return [f for f in await ledger() if f.id == crashed.id and f.outcome == "unknown"]

        await eventually(unknown, timeout=30)
        await hub.schedules.pause(alice, sid)
        await asyncio.sleep(0.3)
    finally:
        proc.kill()
        await proc.wait()
    rows = await ledger()
    assert [f.nominal_time for f in rows].count(crashed.nominal_time) == 1
    assert next(f for f in rows if f.id == crashed.id).task_id is None
    async with hub.db.read() as conn:
        tasks = (await conn.execute(sa.select(sa.func.count()).select_from(task_runs))).scalar()
    assert tasks == sum(1 for f in rows if f.task_id)  # nothing was admitted for the crashed firing
    await hub.db.close()
