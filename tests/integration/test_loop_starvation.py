"""No store call blocks the event loop: while the firing loop works through thousands of due schedules, the same
hub's /healthz keeps answering at once (on SQLite a statement run on the event loop would starve every timer and
HTTP handler of the embedded hub)."""
from __future__ import annotations

import asyncio
import statistics
import time
from datetime import timedelta

import httpx2
import sqlalchemy as sa

from hub.store.tables import schedules
from tests.helpers import eventually, start_hub

BACKLOG = 3000


async def _seed_due(hub, creator_id: str, n: int) -> None:
    now = hub.clock.now()
    rows = [{"id": f"sch_{i:08d}", "creator_id": creator_id, "provenance": {"source": "test"}, "type": "subtask",
             "name": f"s{i}", "prompt": "say hi", "profile": "scripted", "rule": "every 1m", "timezone": "UTC",
             "paused": False, "next_fire_at": now, "created_at": now - timedelta(minutes=1), "updated_at": now}
            for i in range(n)]
    async with hub.db.write() as conn:
        for k in range(0, n, 1000):
            await conn.execute(schedules.insert(), rows[k:k + 1000])


async def test_healthz_answers_within_100ms_while_the_firing_loop_works_through_a_backlog(db_url, tmp_path, clock):
    h = await start_hub(db_url, tmp_path / "home", clock)
    try:
        admin = await h.hub.auth.authenticate(h.admin_token)
        await h.hub.loops.stop()  # run only the firing loop below, on a seeded backlog
        await _seed_due(h.hub, admin.principal_id, BACKLOG)
        sf = h.hub.schedule_firing
        h.hub.loops.start("schedule-firing", sf.firing_step, interval_s=0.05, wake=sf.kicked)
        await eventually(lambda: asyncio.sleep(0, sf.fired > 0), timeout=30)
        latencies = []
        async with httpx2.AsyncClient(timeout=10) as http:
            while sf.fired < BACKLOG and len(latencies) < 200:
                t0 = time.perf_counter()
                r = await http.get(f"{h.url}/healthz")
                latencies.append(time.perf_counter() - t0)
                assert r.status_code == 200
                await asyncio.sleep(0.01)
        assert len(latencies) >= 10, f"the backlog of {BACKLOG} was gone after {len(latencies)} probes"
        assert statistics.median(latencies) < 0.1, f"healthz median {statistics.median(latencies):.3f}s under backlog"
        assert max(latencies) < 2.0, f"one healthz waited {max(latencies):.3f}s behind the firing loop"
        await eventually(lambda: asyncio.sleep(0, sf.fired >= BACKLOG), timeout=600, interval=0.2)
        async with h.hub.db.read() as conn:
            due = (await conn.execute(sa.select(sa.func.count()).select_from(schedules).where(
                schedules.c.next_fire_at <= h.hub.clock.now()))).scalar()
        assert due == 0
    finally:
        await h.stop()
