"""bench/fairness: one user floods the queue, another submits one task a second; the second's wait, with and
without the flood, in one run.

Run: `.venv/bin/python -m bench.fairness [--flood 500] [--seconds 15]`. Prints figures; asserts nothing.
Target: B's submit→running p99 with the flood ≤ the length of one of A's tasks (B takes the next slot that
frees) + B's p99 without it.
"""
from __future__ import annotations

import argparse
import asyncio
import time
from datetime import datetime

import httpx2

from .common import figure, hub_process, pct

TASK_S = 1.0
SLOTS = 8


async def user_token(http: httpx2.AsyncClient, url: str, admin: str, name: str) -> str:
    resp = await http.post(f"{url}/api/v1/tokens", json={"principal": name},
                           headers={"Authorization": f"Bearer {admin}"})
    resp.raise_for_status()
    return resp.json()["token"]


async def submit(http: httpx2.AsyncClient, url: str, token: str, prompt: str) -> str:
    resp = await http.post(f"{url}/api/v1/tasks", json={"prompt": prompt, "profile": "scripted"},
                           headers={"Authorization": f"Bearer {token}"})
    resp.raise_for_status()
    return resp.json()["task_id"]


async def waits(http: httpx2.AsyncClient, url: str, token: str, seconds: int) -> list[float]:
    """Submit one quick task a second; return each one's submit→running time in ms (from the hub's started_at)."""
    ids: list[tuple[str, float]] = []
    for _ in range(seconds):
        sent = time.time()
        ids.append((await submit(http, url, token, "say hi"), sent))
        await asyncio.sleep(1.0)
    out = []
    for task_id, sent in ids:
        while True:
            view = (await http.get(f"{url}/api/v1/tasks/{task_id}",
                                   headers={"Authorization": f"Bearer {token}"})).json()
            if view.get("started_at"):
                out.append((datetime.fromisoformat(view["started_at"]).timestamp() - sent) * 1000)
                break
            await asyncio.sleep(0.2)
    return out


async def main(flood: int, seconds: int) -> None:
    print(f"bench/fairness — user A floods {flood} scripted `sleep {TASK_S:g}` tasks, user B submits one task a "
          f"second for {seconds}s (amux up, SQLite, {SLOTS} slots)")
    env = {"AMUX_HUB__MAX_QUEUED_PER_PRINCIPAL": str(flood + 10)}
    figures = {}
    for label, with_flood in (("unloaded", False), ("flooded", True)):
        async with hub_process(None, slots=SLOTS, env=env) as (url, admin):
            async with httpx2.AsyncClient(timeout=60) as http:
                a, b = await user_token(http, url, admin, "alice"), await user_token(http, url, admin, "bob")
                if with_flood:
                    sem = asyncio.Semaphore(16)

                    async def one() -> None:
                        async with sem:
                            await submit(http, url, a, f"sleep {TASK_S:g}\nsay done")

                    await asyncio.gather(*(one() for _ in range(flood)))
                ms = await waits(http, url, b, seconds)
        figures[label] = (pct(ms, 50), pct(ms, 99))
        print(f"  B submit→running {label:<9} p50 {figures[label][0]:7.1f} ms  p99 {figures[label][1]:7.1f} ms")
    target = TASK_S * 1000 + figures["unloaded"][1]
    flooded = figures["flooded"][1]
    figure("fairness.flooded_p99_ms", f"flooded p99 {flooded:.0f} ms vs one A task + unloaded p99 = {target:.0f} ms",
           value=flooded, unit="ms", ratio=flooded / target, target="≤ 1", floor=target)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--flood", type=int, default=500)  # 8 slots finish ≤ 8 A tasks a second: the queue never drains
    ap.add_argument("--seconds", type=int, default=15)
    args = ap.parse_args()
    asyncio.run(main(args.flood, args.seconds))
