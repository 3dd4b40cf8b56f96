"""bench/outbox: Feishu delivery against the fake Open Platform, which runs in its own process as Feishu would.

    .venv/bin/python -m bench.outbox [--notices N] [--admins 100] [--worker-notices N] [--apps 20] [--no-pg]

1. Channel, one application, the fake enforcing Feishu's limits (50/s per app, 5 QPS per user): N notices for
   100 administrators through `bot.feishu.channel` (lark-oapi models over the app's shared HTTP client,
   hub-managed token, pacing, classification, retry with the same uuid on 429). Sustained rate as a fraction of
   the 50/s limit (target ≥ 0.90) and the sender's CPU per delivered message (target ≤ 2 ms).
2. The outbox worker (claim → gate → send → record on SQLite and PostgreSQL) across 20 applications, the fake
   without limits: notices/s (target ≥ 500) and duplicates (target 0). Every notice goes to its application's
   administrator, so the channel's per-user pacing (Feishu's 5 QPS per user, which the fake does not enforce
   here) is off and the gate's rate limit is widened (`max_new_messages` 10⁶ per 1 s, no quiet hours); app
   pacing stays at 48/s.
"""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import tempfile
import time
from collections import Counter
from datetime import timedelta
from pathlib import Path
from typing import AsyncIterator

import httpx2

from hub.config import FeishuAppSettings

from .common import REPO, figure, free_port, pg_database

APP_LIMIT = 50


@contextlib.asynccontextmanager
async def fake_feishu(app_ids: list[str], limits: bool) -> AsyncIterator[str]:
    """Run tests/fakes/feishu.py in its own process serving `app_ids`; yield its base URL."""
    args = [",".join(app_ids), str(free_port())] + (["--limits"] if limits else [])
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tests.fakes.feishu", *args, cwd=REPO,
                                                stdout=asyncio.subprocess.PIPE)
    try:
        yield (await proc.stdout.readline()).decode().strip()
    finally:
        proc.terminate()
        await proc.wait()


async def fake_stats(base_url: str) -> dict:
    """Read what the fake accepted."""
    async with httpx2.AsyncClient() as http:
        return (await http.get(f"{base_url}/_stats")).json()


async def channel_one_app(notices: int, admins: int, concurrency: int) -> None:
    """Send `notices` through the channel for one application against the rate-limited fake."""
    from bot.feishu.channel import FeishuChannel

    app_id = f"cli_bench{free_port()}"
    async with fake_feishu([app_id], limits=True) as base_url:
        ch = FeishuChannel([FeishuAppSettings(app_id=app_id, app_secret="secret", base_url=base_url)])
        queue: asyncio.Queue = asyncio.Queue()
        for i in range(notices):
            queue.put_nowait((f"ou_admin{i % admins:03d}", f"ntc_bench{i:08d}"))
        retries: Counter = Counter()
        view = {"v": 1, "kind": "receipt", "schedule_name": "bench", "creator": "bench", "outcome": "succeeded"}

        async def worker() -> None:
            while True:
                try:
                    rcp, uuid = queue.get_nowait()
                except asyncio.QueueEmpty:
                    return
                while True:
                    d = await ch.send(app_id, rcp, view, uuid)
                    if d.result == "ok":
                        break
                    retries[d.code] += 1
                    await asyncio.sleep(d.retry_after_s or 0.2)

        await ch.send(app_id, "ou_warmup", view, "ntc_warmup")  # token and first connection, outside the window
        cpu0, start = time.process_time(), time.monotonic()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed, cpu = time.monotonic() - start, time.process_time() - cpu0
        await ch.aclose()
        stats = await fake_stats(base_url)
    sent = stats["sent"] - 1
    dup = sum(c - 1 for c in Counter(stats["uuids"]).values() if c > 1)
    rate = sent / elapsed
    print(f"  outbox channel, one app: {sent} of {notices} notices for {admins} administrators in {elapsed:.1f} s; "
          f"429 answers {stats['rejected_429']} (retries by code {dict(retries)}); duplicates {dup}")
    figure("outbox.one_app.rate", f"outbox one app, fake enforcing 50/s: {rate:.1f} notices/s of {APP_LIMIT}/s",
           value=rate, unit="notices/s", ratio=rate / APP_LIMIT, target="≥ 0.90", floor=APP_LIMIT)
    ms = cpu * 1000 / max(sent, 1)
    figure("outbox.one_app.cpu_ms", f"outbox one app, sender CPU {ms:.2f} ms per message (of a 2 ms budget)",
           value=ms, unit="ms", ratio=ms / 2.0, target="≤ 1.00", floor=2.0)


async def worker_many_apps(label: str, db_url: str, notices: int, apps: int) -> None:
    """Deliver `notices` spread over `apps` applications through the outbox worker, the fake without limits."""
    import sqlalchemy as sa

    from bot.feishu.channel import FeishuChannel
    from hub.clock import SystemClock
    from hub.config import AlertSettings
    from hub.domain.alerts import Numbers
    from hub.services.alerts.outbox import OutboxWorker
    from hub.store.db import Database, upgrade
    from hub.store.tables import feishu_apps, outbox

    await upgrade(db_url)
    db, clock = Database(db_url), SystemClock()
    app_ids = [f"cli_bench{i:02d}_{free_port()}" for i in range(apps)]
    now = clock.now()
    async with db.write() as conn:
        await conn.execute(feishu_apps.insert(), [dict(app_id=a, admin_open_id=f"ou_admin_{a}", admin_epoch=0,
                                                       delivery_state="ok", timezone="UTC", updated_at=now)
                                                  for a in app_ids])
        rows = [dict(id=f"ntc_b{i:08d}", app_id=app_ids[i % apps], recipient=f"ou_admin_{app_ids[i % apps]}",
                     kind="receipt", payload={"v": 1, "kind": "receipt", "schedule_name": f"bench {i}",
                                              "creator": "bench", "outcome": "succeeded"},
                     request_uuid=f"ntc_b{i:08d}", timezone="UTC", state="pending", attempts=0,
                     next_attempt_at=now - timedelta(seconds=1), created_at=now) for i in range(notices)]
        for k in range(0, notices, 1000):
            await conn.execute(outbox.insert(), rows[k:k + 1000])
    settings = AlertSettings(quiet_hours="", max_new_messages=1_000_000, rate_window_s=1.0)
    async with fake_feishu(app_ids, limits=False) as base_url:
        ch = FeishuChannel([FeishuAppSettings(app_id=a, app_secret="secret", base_url=base_url) for a in app_ids],
                           user_rate=0)
        w = OutboxWorker(db, clock, settings, Numbers.of(settings, 3600), ch, worker_id="bench")
        cpu0, start = time.process_time(), time.monotonic()
        rounds = 0
        while w.sent < notices and time.monotonic() - start < 120:
            rounds += 1
            if not await w.deliver_once():
                await asyncio.sleep(0.01)
        elapsed, cpu = time.monotonic() - start, time.process_time() - cpu0
        await ch.aclose()
        stats = await fake_stats(base_url)
    async with db.read() as conn:
        states = dict((await conn.execute(sa.select(outbox.c.state, sa.func.count()).group_by(outbox.c.state))).all())
    await db.close()
    per_uuid = Counter(stats["uuids"])
    dup = sum(c - 1 for c in per_uuid.values() if c > 1) + stats["repeated_uuid_requests"]
    rate = w.sent / elapsed
    print(f"  outbox worker, {apps} apps, {label}: {w.sent} of {notices} sent in {elapsed:.1f} s, {rounds} rounds "
          f"of ≤ {settings.claim_batch} claims, {settings.send_concurrency} concurrent sends; outbox states {states}; "
          f"CPU {cpu * 1000 / max(w.sent, 1):.2f} ms per notice (this process: worker, channel, "
          f"{'SQLite' if label == 'sqlite' else 'asyncpg'})")
    figure(f"outbox.{apps}_apps.{label}.rate", f"outbox worker {apps} apps, {label}, fake without limits: "
           f"{rate:.0f} notices/s", value=rate, unit="notices/s", ratio=rate / 500, target="≥ 1.00", floor=500)
    figure(f"outbox.{apps}_apps.{label}.duplicates", f"outbox worker {apps} apps, {label}: {dup} duplicates "
           f"({stats['sent']} messages for {notices} notices, {stats['repeated_uuid_requests']} repeated sends)",
           value=dup + abs(stats["sent"] - notices), unit="messages", target="= 0",
           met=dup == 0 and stats["sent"] == notices)


async def main(notices: int, admins: int, concurrency: int, worker_notices: int, apps: int, with_pg: bool) -> None:
    """Print the figures."""
    print("bench/outbox — Feishu delivery; the fake Open Platform runs in its own process")
    await channel_one_app(notices, admins, concurrency)
    if worker_notices:
        tmp = Path(tempfile.mkdtemp(prefix="amux-bench-outbox-"))
        await worker_many_apps("sqlite", f"sqlite+aiosqlite:///{tmp / 'outbox.db'}", worker_notices, apps)
        if with_pg:
            try:
                async with pg_database() as url:
                    await worker_many_apps("postgresql", url, worker_notices, apps)
            except OSError as e:
                print(f"  outbox worker, postgresql skipped: {e}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--notices", type=int, default=1000, help="notices for the one-app channel run (≈ 21 s)")
    ap.add_argument("--admins", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=50)
    ap.add_argument("--worker-notices", type=int, default=3000, help="notices for the many-app worker run (0: skip)")
    ap.add_argument("--apps", type=int, default=20)
    ap.add_argument("--no-pg", action="store_true", help="skip the worker run on PostgreSQL")
    a = ap.parse_args()
    asyncio.run(main(a.notices, a.admins, a.concurrency, a.worker_notices, a.apps, not a.no_pg))
