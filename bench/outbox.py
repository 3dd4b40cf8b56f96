"""Outbox delivery benchmark: notices for 100 administrators through the Feishu channel against the fake
Open Platform enforcing Feishu's limits (50/s per app, 5 QPS per user).

    .venv/bin/python -m bench.outbox [--notices N] [--admins 100]

Prints the sustained send rate as a fraction of the app limit (target ≥ 90 %) and duplicates (target 0).
Scope: the channel layer (lark-oapi over HTTP, hub-managed token, pacing, classification, retry with the
same uuid on 429) — the database outbox stages are measured by the contract tests, not here.
"""
from __future__ import annotations

import argparse
import asyncio
import time
from collections import Counter

import sys

import httpx2

from hub.config import FeishuAppSettings

from .common import REPO, free_port


async def main(notices: int, admins: int, concurrency: int) -> None:
    from bot.feishu.channel import FeishuChannel

    # The fake Open Platform runs in its own process, as Feishu would: the sender gets its own core.
    app_id, port = f"cli_bench{free_port()}", free_port()
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "tests.fakes.feishu", app_id, str(port), "--limits",
                                                cwd=REPO, stdout=asyncio.subprocess.PIPE)
    base_url = (await proc.stdout.readline()).decode().strip()
    ch = FeishuChannel([FeishuAppSettings(app_id=app_id, app_secret="secret", base_url=base_url)])
    queue: asyncio.Queue = asyncio.Queue()
    for i in range(notices):
        queue.put_nowait((f"ou_admin{i % admins:03d}", f"ntc_bench{i:08d}"))
    retries = Counter()
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

    start = time.monotonic()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.monotonic() - start
    async with httpx2.AsyncClient() as http:
        stats = (await http.get(f"{base_url}/_stats")).json()
    proc.terminate()
    await proc.wait()
    uuids = Counter(stats["uuids"])
    dup = sum(c - 1 for c in uuids.values() if c > 1)
    rate = stats["sent"] / elapsed
    print(f"notices            {notices} for {admins} administrators")
    print(f"delivered          {stats['sent']} in {elapsed:.1f} s")
    print(f"sustained rate     {rate:.1f}/s = {rate / 50 * 100:.1f} % of the 50/s app limit")
    print(f"429 answers        {stats['rejected_429']}  (retries by code: {dict(retries)})")
    print(f"duplicates         {dup}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--notices", type=int, default=10_000)
    ap.add_argument("--admins", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=50)
    a = ap.parse_args()
    asyncio.run(main(a.notices, a.admins, a.concurrency))
