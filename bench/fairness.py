"""bench/fairness: how placement shares a fleet between principals, and what a light user waits behind a heavy one.

Run: `.venv/bin/python -m bench.fairness [--minutes 30] [--flood 500] [--seconds 10] [--skip-wall]`. Prints figures;
asserts nothing. Two parts (≈ 40 s together):

- shares: the hub's own placement and store in process (SQLite), in virtual time: 8 slots, 30 virtual minutes, 2–4
  principals with backlogs or steady arrivals. The runner is replaced by the clock (a run ends once its scripted
  `sleep` has passed), so the figures are the placement rule's, deterministic. Per principal: its share of the
  slot-time beside its max-min fair share (what it would get if the slots went to whoever holds the fewest), and its
  queue wait. Targets: Jain's index over actual / fair ≥ 0.95; the light user's p99 wait ≤ one heavy task.
- wall clock: `amux up` (SQLite, 8 slots, its runner): user A floods `sleep 1` tasks, user B submits one task a second;
  B's submit→running with and without the flood. Target: flooded p99 ≤ one A task + unloaded p99.
"""
from __future__ import annotations

import argparse
import asyncio
import heapq
import logging
import shutil
import tempfile
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import httpx2
import sqlalchemy as sa

from hub.app import Hub
from hub.clock import ManualClock
from hub.config_sources import load_settings
from hub.domain.tasks import Status
from hub.runner import protocol as p
from hub.services.tasks.admission import SubmitRequest
from hub.store.db import Database, upgrade_sync
from hub.store.tables import task_runs

from .common import figure, hub_process, pct

TASK_S = 1.0
SLOTS = 8
CAPS = {"platform": "linux", "engines": ["scripted"], "workspace_root": "/tmp", "workspace_writable": True}


# --------------------------------------------------------------------------- shares, in virtual time

@dataclass(frozen=True)
class User:
    """A workload of one principal (`principal`, else `name`): a backlog queued at `start`, or one task every `every`
    seconds from `start`; `runtime` pins its tasks to one runtime."""

    name: str
    length_s: float
    backlog: int = 0
    every: float = 0.0
    start: float = 0.0
    principal: str = ""
    runtime: str | None = None

    @property
    def who(self) -> str:
        """Return the principal that submits it."""
        return self.principal or self.name

    def describe(self) -> str:
        """Say what the user submits."""
        what = f"backlog of {self.backlog} × {self.length_s:g} s" if self.backlog else \
            f"{self.length_s:g} s every {self.every:g} s"
        return f"{self.name} ({what}{f' on {self.runtime}' if self.runtime else ''})"

    def demand(self) -> float:
        """Slots this user would keep busy alone (a backlog: all of them)."""
        return float("inf") if self.backlog else self.length_s / self.every


FLEET = {"fleet": (SLOTS, None)}  # runtime name → (slots, owning principal; None: shared)
SCENARIOS = {
    "2p": (FLEET, [User("heavy", 60, backlog=400), User("light", 20, every=30, start=60)]),
    "3p": (FLEET, [User("heavy", 60, backlog=400), User("heavy-long", 600, backlog=40, start=5),
                   User("light", 20, every=30, start=60)]),
    "4p": (FLEET, [User("heavy", 60, backlog=400), User("heavy-long", 600, backlog=40, start=5),
                   User("steady", 60, every=20, start=30), User("light", 20, every=30, start=60)]),
    # Bob keeps his own runtime busy and waits for the shared one: his runs there must not cost him his share of it.
    "own": ({"fleet": (SLOTS // 2, None), "bob-box": (SLOTS // 2, "bob")},
            [User("heavy", 60, backlog=400), User("bob-batch", 600, backlog=40, principal="bob", runtime="bob-box"),
             User("light", 20, every=30, start=60, principal="bob", runtime="fleet")]),
}


def max_min(users: list[User], slots: int) -> dict[str, float]:
    """Water-fill `slots` over the users' demands: each gets at most its demand, the rest split evenly."""
    left, out, open_ = float(slots), {}, sorted(users, key=User.demand)
    while open_:
        each = left / len(open_)
        u = open_.pop(0)
        out[u.name] = min(u.demand(), each)
        left -= out[u.name]
    return out


async def simulate(fleet: dict[str, tuple[int, str | None]], users: list[User], horizon: float, home: Path,
                   template: Path) -> dict[str, dict[str, float]]:
    """Run the workload through the hub's placement in virtual time; return each user's slot-time and waits."""
    shutil.copy(template, home / "shares.db")
    url = f"sqlite+aiosqlite:///{home / 'shares.db'}"
    clock = ManualClock()
    t0 = clock.now()
    hub = Hub(load_settings(env={}, home=str(home), database_url=url), Database(url), clock)
    for name, (slots, owner) in fleet.items():  # a shared runtime is an admin's runner's; a private one its owner's
        runner = await hub.auth.authenticate(await hub.auth.create_token(owner or "ops", admin=owner is None,
                                                                         runner=True), surface="runner")
        await hub.registry.register(runner, p.Register(name=name, slots=slots, capabilities=CAPS))
    callers = {u.who: await hub.auth.authenticate(await hub.auth.create_token(u.who)) for u in users}
    arrivals = []  # (t, seq, user)
    for u in users:
        times = [u.start] * u.backlog if u.backlog else \
            [u.start + i * u.every for i in range(int((horizon - u.start) // u.every) + 1)]
        arrivals += [(t, len(arrivals), u) for t in times if t < horizon]
    arrivals.sort(key=lambda a: (a[0], a[1]))
    ends: list[tuple[float, str]] = []
    info: dict[str, tuple[User, float]] = {}  # task id → (user, submitted at)
    started: dict[str, float] = {}
    i = 0
    while True:
        now = min(arrivals[i][0] if i < len(arrivals) else horizon, ends[0][0] if ends else horizon)
        if now >= horizon:
            break
        clock.set(t0 + timedelta(seconds=now))
        due = []
        while ends and ends[0][0] <= now:
            due.append(heapq.heappop(ends)[1])
        if due:
            async with hub.db.write() as conn:
                for task_id in due:
                    await hub.tasks.store.finish(conn, task_id, Status.SUCCEEDED, clock.now())
        batch = []
        while i < len(arrivals) and arrivals[i][0] <= now:
            batch.append(arrivals[i][2])
            i += 1
        subs = await asyncio.gather(*(hub.tasks.submit(callers[u.who], SubmitRequest(
            prompt=f"sleep {u.length_s:g}", profile="scripted", runtime=u.runtime)) for u in batch))
        for u, sub in zip(batch, subs):
            info[sub["task_id"]] = (u, now)
        while await hub.dispatcher.place_once():
            pass
        async with hub.db.read() as conn:
            placed = set((await conn.execute(sa.select(task_runs.c.id).where(
                task_runs.c.status == Status.DISPATCHED.value))).scalars()) - started.keys()
        for task_id in placed:
            started[task_id] = now
            heapq.heappush(ends, (now + info[task_id][0].length_s, task_id))
    await hub.tasks.aclose()
    await hub.db.close()
    out = {u.name: {"slot_s": 0.0, "runs": 0, "waits": []} for u in users}
    for task_id, (u, submitted) in info.items():
        begun = started.get(task_id)
        if begun is not None:
            out[u.name]["slot_s"] += min(begun + u.length_s, horizon) - begun
            out[u.name]["runs"] += 1
        if not u.backlog:  # a backlog's waits say nothing; a stream's are what its user feels (unstarted: so far)
            out[u.name]["waits"].append((begun if begun is not None else horizon) - submitted)
    return out


async def shares(minutes: float) -> None:
    """Print each scenario's shares and waits, and the fairness figures."""
    horizon = minutes * 60
    print(f"bench/fairness shares — the hub's placement in virtual time ({SLOTS} slots, {minutes:g} virtual minutes, "
          "SQLite; runs end when their scripted sleep has passed)")
    with tempfile.TemporaryDirectory(prefix="amux-bench-") as tmp:
        template = Path(tmp) / "template.db"
        await asyncio.to_thread(upgrade_sync, f"sqlite+aiosqlite:///{template}")
        for key, (fleet, users) in SCENARIOS.items():
            await _scenario(key, fleet, users, horizon, template)


async def _scenario(key: str, fleet: dict[str, tuple[int, str | None]], users: list[User], horizon: float,
                    template: Path) -> None:
    """Simulate one scenario; print its rows and figures (the max-min comparison on a one-runtime fleet only)."""
    t = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="amux-bench-") as home:
        got = await simulate(fleet, users, horizon, Path(home), template)
    fair = max_min(users, SLOTS) if len(fleet) == 1 else None
    print(f"  {key}: " + ", ".join(u.describe() for u in users) + f"  [{time.monotonic() - t:.1f} s]")
    xs = []
    for u in users:
        g = got[u.name]
        share = g["slot_s"] / (SLOTS * horizon)
        ideal = f"  (max-min fair {fair[u.name] / SLOTS * 100:5.1f} %)" if fair else ""
        if fair:
            xs.append(share / (fair[u.name] / SLOTS))
        waits = g["waits"]
        wait = f"   wait p50 {pct(waits, 50):6.1f} s  p99 {pct(waits, 99):6.1f} s" if waits else ""
        print(f"    {u.name:<11} slot-time {share * 100:5.1f} %{ideal}  {g['runs']:4d} runs{wait}")
    if xs:
        jain = sum(xs) ** 2 / (len(xs) * sum(x * x for x in xs))
        figure(f"fairness.shares_{key}.jain", f"{key}: Jain's index over slot-time / max-min fair share {jain:.3f}",
               value=jain, unit="index", ratio=jain, target="≥ 0.95")
    heavy = min(u.length_s for u in users if u.backlog and u.runtime is None)
    p99 = pct(got["light"]["waits"], 99)
    figure(f"fairness.shares_{key}.light_wait_p99_s",
           f"{key}: light user's queue wait p99 {p99:.1f} s vs one heavy task {heavy:g} s",
           value=p99, unit="s", ratio=p99 / heavy, target="≤ 1", floor=heavy)


# --------------------------------------------------------------------------- wall clock, amux up

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


async def wall_clock(flood: int, seconds: int) -> None:
    """Print B's submit→running behind A's flood and without it, and the figure."""
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


async def main(minutes: float, flood: int, seconds: int, skip_wall: bool) -> None:
    """Run both parts."""
    logging.disable(logging.INFO)  # the in-process hub's and the HTTP client's lines; figures are printed
    await shares(minutes)
    if not skip_wall:
        await wall_clock(flood, seconds)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--minutes", type=float, default=30)  # virtual minutes of the shares part
    ap.add_argument("--flood", type=int, default=500)  # 8 slots finish ≤ 8 A tasks a second: the queue never drains
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--skip-wall", action="store_true", help="only the virtual-time shares")
    args = ap.parse_args()
    asyncio.run(main(args.minutes, args.flood, args.seconds, args.skip_wall))
