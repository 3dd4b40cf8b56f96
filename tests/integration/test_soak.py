"""A soak with faults: three `amux hub serve` processes on one PostgreSQL (a throwaway cluster of the test's own),
two real `amux runner` processes and 200 simulated runners (real `Runner` objects speaking the real protocol over
real WebSockets, in this process), all reaching the hubs through a small round-robin TCP proxy as they would
through a load balancer, and the fake Feishu Open Platform with one app whose administrator gets the notices.
Load: scripted tasks over MCP and REST, 1,000 per-minute schedules (one in a hundred failing: their failures
become notices), lease takeover races. Faults, in order: kill -9 of a hub replica (restarted after a few seconds,
as an orchestrator would), kill -9 of a real runner (restarted later), `pg_ctl restart` of the database.

The bounded run does not wait a minute for the schedules: each one's first nominal time is moved into the load
phase (spread over it) in the database, as an injected clock would; the per-minute rule takes over from there.

Afterwards, from the database and the fake Feishu log: every submitted task reached exactly one terminal state,
no firing lost or doubled for one nominal time, no notice sent twice (its uuid), no lease with two live handles,
every replica ready again on its own, every runner back online on a surviving replica. The counts are printed.

`make soak` runs the same for 10 minutes (AMUX_SOAK_DURATION_S, AMUX_SOAK_SIM_RUNNERS), repeating the fault cycle
every two minutes, and prints throughput, p99 latencies and recovery times.
"""
from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import logging
import os
import random
import shutil
import signal
import socket
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

import aiohttp
import httpx2
import pytest
import sqlalchemy as sa
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import Implementation
from sqlalchemy.ext.asyncio import create_async_engine

from hub.engines.scripted import ScriptedEngine
from hub.ids import new_id
from hub.runner.agent import Runner
from hub.domain.states import IncidentState
from hub.services.alerts.outbox import LIVE
from hub.store.tables import (api_tokens, decisions, firings, identity_bindings, incidents, outbox, runtimes, schedules,
                              task_runs)
from tests.fakes.feishu import FakeFeishu
from tests.helpers import PROCESS_MODE, REPO, runner_command, started

DURATION_S = float(os.environ.get("AMUX_SOAK_DURATION_S", "30"))  # load phase; setup and drain come on top
SIM_RUNNERS = int(os.environ.get("AMUX_SOAK_SIM_RUNNERS", "200"))
SCHEDULES = int(os.environ.get("AMUX_SOAK_SCHEDULES", "1000"))
FAILING_EVERY = 100  # one schedule in this many fails each firing
RATE = float(os.environ.get("AMUX_SOAK_RATE", "0.75"))  # submissions/s of each of 2 MCP and 2 REST clients
CYCLE_S = 120.0  # one fault cycle per this much load (the bounded run has exactly one)
INTERVAL_S = 60  # schedule rule: every minute
FIRST_SPREAD_S = min(50.0, DURATION_S * 0.6)  # first nominal times are spread over this much of the load phase
ADMIN_OPEN_ID = "ou_soak_admin"
TERMINAL = ("succeeded", "failed", "cancelled", "timed_out")
HUB_ENV = {  # fast clocks so faults resolve inside the run
    "AMUX_HUB__POLL_S": "0.25", "AMUX_HUB__HEARTBEAT_S": "2", "AMUX_HUB__RUNTIME_LOST_S": "10",
    "AMUX_HUB__RESERVATION_TTL_S": "8", "AMUX_SCHEDULES__MIN_INTERVAL_S": "1",
    "AMUX_SCHEDULES__UNKNOWN_AFTER_S": "10", "AMUX_SCHEDULES__RECONCILE_S": "0.5",
    # the whole fleet reaches the hubs from 127.0.0.1 through one proxy: no per-client connection limits
    "AMUX_HUB__MAX_PENDING_PER_CLIENT": "0", "AMUX_HUB__MAX_CONNECTIONS_PER_CLIENT": "0",
}


def hub_toml(fake: FakeFeishu) -> str:
    """The replicas' amux.toml: one webhook-mode Feishu app on the fake server, notices without quiet hours."""
    return f"""
[alerts]
aggregation_s = 2
quiet_hours = ""
lease_s = 5
retry_base_s = 0.2
poll_s = 0.2
[[feishu.apps]]
app_id = "{fake.app_id}"
app_secret = "{fake.app_secret}"
admin_open_id = "{ADMIN_OPEN_ID}"
verification_token = "vt"
base_url = "{fake.base_url}"
"""


pytestmark = pytest.mark.skipif(os.geteuid() != 0 and not shutil.which("initdb"),
                                reason="needs PostgreSQL server binaries for a throwaway cluster")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ensure_postgres_module():
    spec = importlib.util.spec_from_file_location("ensure_postgres", REPO / ".ci" / "ensure_postgres.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Postgres:
    """A throwaway cluster of this test's own (never the machine's shared server): started, restarted, purged."""

    def __init__(self) -> None:
        self.ep = _ensure_postgres_module()
        bindir = self.ep.find_pg_bindir()
        if not bindir:
            pytest.skip("no initdb/pg_ctl here")
        self.cluster = self.ep.Cluster(self.ep.Runner(), bindir)
        base = f"/tmp/amux-soak-pg-{os.getpid()}"
        c = self.cluster
        c.base, c.data, c.sock = base, f"{base}/data", f"{base}/sock"
        c.logfile, c.portfile = f"{base}/postgres.log", f"{base}/data/amux_port"

    def start(self) -> str:
        c = self.cluster
        c.prepare_dirs()
        c.initdb()
        port = c.start()
        c.ensure_database(port)
        return f"postgresql+asyncpg://postgres@127.0.0.1:{port}/test"

    def restart(self) -> None:
        c = self.cluster
        rc, out = c.runner.run([c.bin("pg_ctl"), "-D", c.data, "-m", "fast", "-w", "-t", "60", "restart"], cwd=c.base)
        assert rc == 0, out

    def purge(self) -> None:
        with contextlib.suppress(Exception):
            self.cluster.stop()
        shutil.rmtree(self.cluster.base, ignore_errors=True)


class Proxy:
    """Round-robin TCP proxy over the replicas: a dead replica refuses, the next one is tried."""

    def __init__(self, backends: list[int]) -> None:
        self.backends = backends
        self.port = free_port()
        self.next = 0
        self.server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up = None
        for i in range(len(self.backends)):
            port = self.backends[(self.next + i) % len(self.backends)]
            try:
                up = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), 2)
                break
            except (OSError, asyncio.TimeoutError):
                continue
        self.next += 1
        if up is None:
            writer.close()
            return
        ur, uw = up

        async def pipe(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
            try:
                while data := await r.read(65536):
                    w.write(data)
                    await w.drain()
            except (OSError, asyncio.CancelledError):
                pass
            finally:
                with contextlib.suppress(Exception):
                    w.close()

        await asyncio.gather(pipe(reader, uw), pipe(ur, writer))

    async def stop(self) -> None:
        if self.server:
            self.server.close()


@dataclass
class Stats:
    """What the load saw."""

    submitted: dict[str, str] = field(default_factory=dict)  # task_id -> via
    submit_errors: int = 0
    lease_races: int = 0
    lease_double_live: int = 0
    lease_errors: int = 0
    startup_exits: int = 0  # replicas that died while starting (e.g. their migration hit the PostgreSQL restart)
    events: list[str] = field(default_factory=list)
    recovery: dict[str, list[float]] = field(default_factory=dict)

    def note(self, text: str) -> None:
        self.events.append(f"{time.strftime('%H:%M:%S')} {text}")
        print(f"soak: {text}", flush=True)


class Fleet:
    """The hub replicas, the real runners, the simulated runners."""

    def __init__(self, tmp: Path, db_url: str, toml: str) -> None:
        self.tmp, self.db_url, self.toml = tmp, db_url, toml
        self.ports = [free_port() for _ in range(3)]
        self.hubs: list[asyncio.subprocess.Process | None] = [None] * 3
        self.runners: list[asyncio.subprocess.Process | None] = [None] * 2
        self.sims: list[tuple[Runner, asyncio.Task]] = []
        self.secret = "soak-" + os.urandom(8).hex()
        self.token = ""

    async def start_hub(self, i: int) -> None:
        home = self.tmp / f"hub{i}"
        home.mkdir(parents=True, exist_ok=True)
        (home / "amux.toml").write_text(self.toml)
        env = {**os.environ, **HUB_ENV, "AMUX_HOME": str(home), "AMUX_SECRET_KEY": self.secret}
        log = open(self.tmp / f"hub{i}.log", "ab")  # noqa: SIM115
        self.hubs[i] = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hub.cli", "hub", "serve", "--db", self.db_url, "--listen",
            f"127.0.0.1:{self.ports[i]}", cwd=REPO, env=env, stdout=log, stderr=log)

    async def start_runner(self, i: int, hub_url: str) -> None:
        log = open(self.tmp / f"runner{i}.log", "ab")  # noqa: SIM115
        self.runners[i] = await asyncio.create_subprocess_exec(
            *runner_command(hub_url, self.token, f"real-{i}", 4, self.tmp / f"ws-real-{i}"), cwd=REPO,
            env={**os.environ, "AMUX_HOME": str(self.tmp / f"rhome{i}")}, stdout=log, stderr=log)

    def start_sims(self, hub_url: str, n: int) -> None:
        engines = {"scripted": ScriptedEngine()}
        for i in range(n):
            r = Runner(hub_url, self.token, name=f"sim-{i:03d}", slots=2,
                       **PROCESS_MODE, workspace_root=self.tmp / "sim" / f"{i:03d}",
                       engines=engines)
            self.sims.append((r, asyncio.create_task(r.run_forever())))

    async def ready(self, i: int) -> bool:
        try:
            async with httpx2.AsyncClient(timeout=2) as http:
                return (await http.get(f"http://127.0.0.1:{self.ports[i]}/readyz")).status_code == 200
        except httpx2.TransportError:
            return False

    async def kill(self, proc: asyncio.subprocess.Process | None) -> None:
        if proc is not None and proc.returncode is None:
            proc.send_signal(signal.SIGKILL)
            await proc.wait()

    async def stop(self) -> None:
        for r, t in self.sims:
            await r.stop()
            t.cancel()
        for _r, t in self.sims:
            with contextlib.suppress(BaseException):
                await t
        for p in [*self.runners, *self.hubs]:
            if p is not None and p.returncode is None:
                p.terminate()
        for p in [*self.runners, *self.hubs]:
            if p is not None:
                try:
                    await asyncio.wait_for(p.wait(), 10)
                except asyncio.TimeoutError:
                    await self.kill(p)


async def until(predicate, timeout: float, interval: float = 0.2) -> float:
    """Wait for an async predicate; return the seconds it took (raise after `timeout`)."""
    t0 = time.monotonic()
    while not await predicate():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"not within {timeout}s: {predicate}")
        await asyncio.sleep(interval)
    return time.monotonic() - t0


@contextlib.asynccontextmanager
async def mcp(url: str, token: str, name: str):
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=15) as http:
        async with Client(streamable_http_client(f"{url}/mcp", http_client=http),
                          client_info=Implementation(name=name, version="1.0")) as client:
            yield client


def prompt(i: int) -> str:
    if i % 10 == 3:
        return f"say soak {i}\nfail planned failure {i}"
    return f"say soak {i}\nsleep {random.choice((0.1, 0.3, 0.8))}"


async def mcp_submitter(url: str, token: str, stats: Stats, stop: asyncio.Event, rate: float, wid: int) -> None:
    i = 0
    while not stop.is_set():
        try:
            async with mcp(url, token, f"soak-mcp-{wid}") as c:
                while not stop.is_set():
                    i += 1
                    res = await c.call_tool("task_submit", {"prompt": prompt(i), "profile": "scripted",
                                                            "name": f"mcp-{wid}-{i}"})
                    if res.is_error:
                        stats.submit_errors += 1
                    else:
                        stats.submitted[res.structured_content["task_id"]] = "mcp"
                    await asyncio.sleep(1 / rate)
        except Exception:  # a replica died mid-call: reconnect through the proxy
            stats.submit_errors += 1
            await asyncio.sleep(0.5)


async def rest_submitter(url: str, token: str, stats: Stats, stop: asyncio.Event, rate: float, wid: int) -> None:
    i = 0
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"},
                                     timeout=aiohttp.ClientTimeout(total=15)) as http:
        while not stop.is_set():
            i += 1
            try:
                async with http.post(f"{url}/api/v1/tasks", json={"prompt": prompt(i), "profile": "scripted",
                                                                  "name": f"rest-{wid}-{i}"}) as r:
                    if r.status == 201:
                        stats.submitted[(await r.json())["task_id"]] = "rest"
                    else:
                        stats.submit_errors += 1
            except (aiohttp.ClientError, asyncio.TimeoutError, OSError):
                stats.submit_errors += 1
            await asyncio.sleep(1 / rate)


async def lease_racer(url: str, token: str, stats: Stats, stop: asyncio.Event, wid: int) -> None:
    """Two clients take one lease over at once; afterwards exactly one of the three handles may work."""
    while not stop.is_set():
        try:
            async with mcp(url, token, f"soak-lease-a{wid}") as a, mcp(url, token, f"soak-lease-b{wid}") as b:
                while not stop.is_set():
                    new = await a.call_tool("rift_task_new", {"name": f"soak-{wid}"})
                    if new.is_error:
                        stats.lease_errors += 1
                        await asyncio.sleep(0.5)
                        continue
                    held = new.structured_content
                    r1, r2 = await asyncio.gather(
                        a.call_tool("rift_task_attach", {"task_id": held["task_id"], "takeover": True}),
                        b.call_tool("rift_task_attach", {"task_id": held["task_id"], "takeover": True}))
                    handles = [held["handle"]] + [r.structured_content["handle"] for r in (r1, r2) if not r.is_error]
                    live = 0
                    for h in handles:
                        res = await a.call_tool("rift_vm_list", {"task": h})
                        live += not res.is_error
                    stats.lease_races += 1
                    if live != 1:
                        stats.lease_double_live += live > 1
                        stats.lease_errors += live == 0
                    await a.call_tool("rift_task_close", {"task": handles[-1]})
                    await asyncio.sleep(0.3)
        except Exception:
            stats.lease_errors += 1
            await asyncio.sleep(0.5)


async def faults(fleet: Fleet, pg: Postgres, proxy_url: str, stats: Stats, duration: float) -> None:
    """One cycle per CYCLE_S of load: kill -9 a hub (restart it 3 s later), kill -9 a runner (restart it later),
    restart PostgreSQL."""
    cycle = min(duration, CYCLE_S)
    start = time.monotonic()
    watchers: list[asyncio.Task] = []
    n = 0
    while time.monotonic() - start + cycle <= duration + 1:
        c0 = start + n * cycle
        victim = n % 3
        await asyncio.sleep(max(0.0, c0 + 0.15 * cycle - time.monotonic()))
        stats.note(f"kill -9 hub replica {victim} (pid {fleet.hubs[victim].pid})")
        await fleet.kill(fleet.hubs[victim])
        await asyncio.sleep(3)
        await fleet.start_hub(victim)  # as an orchestrator would; the next faults do not wait for it
        stats.note(f"hub replica {victim} restarted")
        watchers.append(asyncio.create_task(_record_ready(fleet, victim, stats)))
        await asyncio.sleep(max(0.0, c0 + 0.35 * cycle - time.monotonic()))
        r = n % 2
        stats.note(f"kill -9 runner real-{r} (pid {fleet.runners[r].pid})")
        await fleet.kill(fleet.runners[r])
        await asyncio.sleep(max(0.0, c0 + 0.55 * cycle - time.monotonic()))
        up_before = [i for i in range(3) if await fleet.ready(i)]  # a replica still starting is not counted
        stats.note(f"pg_ctl restart -m fast (replicas ready before: {up_before})")
        t = time.monotonic()
        await asyncio.to_thread(pg.restart)
        pg_up = time.monotonic() - t

        async def back() -> bool:
            return all(await asyncio.gather(*(fleet.ready(i) for i in up_before)))

        took = await until(back, 120)
        stats.recovery.setdefault("postgres restart (s)", []).append(pg_up)
        stats.recovery.setdefault("replicas ready again after postgres is back (s)", []).append(took)
        stats.note(f"postgres back after {pg_up:.1f}s; replicas {up_before} ready {took:.1f}s later")
        await asyncio.sleep(max(0.0, c0 + 0.75 * cycle - time.monotonic()))
        stats.note(f"restart runner real-{r}")
        await fleet.start_runner(r, proxy_url)
        n += 1
    await asyncio.gather(*watchers)


async def _record_ready(fleet: Fleet, i: int, stats: Stats) -> None:
    """Wait for a restarted replica; if it exits while starting, start it again, as an orchestrator would."""
    t0 = time.monotonic()

    async def up() -> bool:
        proc = fleet.hubs[i]
        if proc is not None and proc.returncode is not None:
            stats.startup_exits += 1
            stats.note(f"hub replica {i} exited with {proc.returncode} while starting; starting it again")
            await fleet.start_hub(i)
            return False
        return await fleet.ready(i)

    await started(up, f"hub replica {i} restarted", timeout=300, interval=0.5)
    took = time.monotonic() - t0
    stats.recovery.setdefault("replica restart to ready (s)", []).append(took)
    stats.note(f"hub replica {i} ready {took:.1f}s after its restart")


async def _all_ready(fleet: Fleet) -> bool:
    return all(await asyncio.gather(*(fleet.ready(i) for i in range(3))))


def pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


async def create_schedules(url: str, token: str, n: int) -> list[str]:
    """Create `n` per-minute schedules over REST (20 at a time); every FAILING_EVERY-th one fails."""
    ids: list[str] = []
    sem = asyncio.Semaphore(20)
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"},
                                     timeout=aiohttp.ClientTimeout(total=30)) as http:
        async def one(k: int) -> None:
            body = f"fail scheduled failure {k}" if k % FAILING_EVERY == 0 else f"say tick {k}"
            async with sem, http.post(f"{url}/api/v1/schedules", json={
                    "prompt": body, "rule": f"every {INTERVAL_S // 60}m", "name": f"soak-{k}",
                    "profile": "scripted"}) as r:
                assert r.status == 201, await r.text()
                ids.append((await r.json())["schedule_id"])

        await asyncio.gather(*(one(k) for k in range(n)))
    return ids


async def test_three_replicas_survive_kill_9_of_a_hub_and_a_runner_and_a_postgres_restart_under_load():
    logging.getLogger("amux.runner").setLevel(logging.WARNING)
    t_test = time.monotonic()
    # Not pytest's tmp_path: the processes' logs are kept there after a failure, and pytest rotates its folders.
    tmp_path = Path(tempfile.mkdtemp(prefix="amux-soak-"))
    passed = False
    sim_log = logging.FileHandler(tmp_path / "sims.log")  # the simulated runners' warnings and errors
    sim_log.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger("amux.runner").addHandler(sim_log)
    pg = Postgres()
    db_url = await asyncio.to_thread(pg.start)
    fake = await FakeFeishu().start()
    fleet = Fleet(tmp_path, db_url, hub_toml(fake))
    proxy = Proxy(fleet.ports)
    stats = Stats()
    stop = asyncio.Event()
    workers: list[asyncio.Task] = []
    engine = create_async_engine(db_url, pool_pre_ping=True)
    try:
        # -- bring up: three replicas race the migrations on an empty database -----------------------------
        for i in range(3):
            await fleet.start_hub(i)
        # three interpreters importing at once on a busy machine
        await started(lambda: _all_ready(fleet), "three hub replicas", timeout=300, interval=0.2)
        await started(lambda: (tmp_path / "hub0" / "admin.token").exists(), "hub0 admin token")
        fleet.token = (tmp_path / "hub0" / "admin.token").read_text().strip()
        stats.note(f"3 replicas ready after {time.monotonic() - t_test:.1f}s")
        async with engine.begin() as conn:  # the admin is known in the Feishu app: its schedules' notices go there
            admin = (await conn.execute(sa.select(api_tokens.c.principal_id).where(
                api_tokens.c.admin.is_(True), api_tokens.c.revoked_at.is_(None)).limit(1))).scalar()
            await conn.execute(identity_bindings.insert().values(
                id=new_id("ib"), principal_id=admin, app_id=fake.app_id, open_id="ou_soak_creator",
                status="active", created_at=sa.func.now()))
        await proxy.start()
        url = f"http://127.0.0.1:{proxy.port}"

        async def online() -> set[str]:
            async with engine.connect() as conn:
                online = sa.select(runtimes.c.name).where(runtimes.c.status == "online")
                return set((await conn.execute(online)).scalars())

        for r in range(2):
            await fleet.start_runner(r, url)
        # schedules need a scripted runtime
        await started(lambda: _is_superset(online(), {"real-0", "real-1"}), "runners real-0 and real-1", interval=0.2)
        t_sched = time.monotonic()
        sched_ids = await create_schedules(url, fleet.token, SCHEDULES)
        stats.note(f"{SCHEDULES} schedules every {INTERVAL_S}s created in {time.monotonic() - t_sched:.1f}s")
        fleet.start_sims(url, SIM_RUNNERS)
        expected = {f"real-{r}" for r in range(2)} | {f"sim-{i:03d}" for i in range(SIM_RUNNERS)}

        try:
            t_sims = time.monotonic()
            await started(lambda: _is_superset(online(), expected), "every runner online", interval=0.2)
            took = time.monotonic() - t_sims
        except AssertionError:
            async with engine.connect() as conn:
                st = dict((await conn.execute(sa.select(runtimes.c.name, runtimes.c.status))).all())
            late = sorted(expected - await online())
            raise AssertionError(f"{len(late)} runners not online after 90 s: "
                                 f"{[(n, st.get(n, 'never registered')) for n in late[:20]]}") from None
        stats.note(f"{len(expected)} runners online {took:.1f}s after they started")

        # -- load and faults --------------------------------------------------------------------------------
        t_load = time.monotonic()
        async with engine.begin() as conn:  # the injected clock: each first nominal time moves into the load phase
            db_now = (await conn.execute(sa.select(sa.func.now()))).scalar()
            step = FIRST_SPREAD_S / max(1, len(sched_ids))
            await conn.execute(schedules.update().where(schedules.c.id == sa.bindparam("sid")).values(
                next_fire_at=sa.bindparam("at")), [{"sid": sid, "at": db_now + timedelta(seconds=1 + k * step)}
                                                   for k, sid in enumerate(sched_ids)])
            first = dict((await conn.execute(sa.select(schedules.c.id, schedules.c.next_fire_at))).all())
        workers += [asyncio.create_task(mcp_submitter(url, fleet.token, stats, stop, RATE, w)) for w in range(2)]
        workers += [asyncio.create_task(rest_submitter(url, fleet.token, stats, stop, RATE, w)) for w in range(2)]
        workers += [asyncio.create_task(lease_racer(url, fleet.token, stats, stop, w)) for w in range(2)]
        await faults(fleet, pg, url, stats, DURATION_S)
        await asyncio.sleep(max(0.0, t_load + DURATION_S - time.monotonic()))
        stop.set()
        await asyncio.wait(workers, timeout=20)
        load_s = time.monotonic() - t_load
        t_stop = time.monotonic()
        async with engine.connect() as conn:  # schedules stop firing now: the ledger is checked up to here
            await conn.execute(sa.update(schedules).values(paused=True))
            await conn.commit()
            cutoff = (await conn.execute(sa.select(sa.func.now()))).scalar()

        # -- drain, then check from the database and the Feishu log ---------------------------------------------
        async def open_work() -> int:
            async with engine.connect() as conn:
                tasks_open = (await conn.execute(sa.select(sa.func.count()).select_from(task_runs).where(
                    task_runs.c.status.notin_(TERMINAL)))).scalar()
                notices_open = (await conn.execute(sa.select(sa.func.count()).select_from(outbox).where(
                    outbox.c.state == LIVE, outbox.c.next_attempt_at <= sa.func.now()))).scalar()
                # The alert pipeline behind a failed run: its outcome not yet decided (reconciled, then ingested),
                # or its incident still aggregating (`alerts.aggregation_s`) before its first card is queued.
                undecided = (await conn.execute(sa.select(sa.func.count()).select_from(firings).where(
                    firings.c.outcome == "failed",
                    ~sa.exists().where(decisions.c.firing_id == firings.c.id)))).scalar()
                aggregating = (await conn.execute(sa.select(sa.func.count()).select_from(incidents).where(
                    incidents.c.state == IncidentState.PENDING.value, incidents.c.failures > 0))).scalar()
                return tasks_open + notices_open + undecided + aggregating

        backlog = await open_work()  # what the load left queued or in flight (the offered rate past capacity)
        with contextlib.suppress(AssertionError):  # the long run may end with a backlog: let it drain, and say so
            await until(lambda: _eq(open_work(), 0), max(120.0, DURATION_S), 0.5)
        drain_s = time.monotonic() - t_stop
        async with engine.connect() as conn:
            rows = (await conn.execute(sa.select(task_runs.c.id, task_runs.c.status, task_runs.c.outcome,
                                                 task_runs.c.error, task_runs.c.created_at, task_runs.c.started_at,
                                                 task_runs.c.finished_at, task_runs.c.runtime_id,
                                                 task_runs.c.attempt))).all()
            fir = (await conn.execute(sa.select(firings.c.schedule_id, firings.c.nominal_time, firings.c.admission,
                                                firings.c.task_id, firings.c.missed_count, firings.c.outcome)
                                      .order_by(firings.c.schedule_id, firings.c.nominal_time))).all()
            notices = (await conn.execute(sa.select(
                outbox.c.id, outbox.c.kind, outbox.c.state, outbox.c.request_uuid, outbox.c.message_id,
                (outbox.c.next_attempt_at <= sa.func.now()).label("due")))).all()
            stuck_detail = (await conn.execute(sa.text(
                "SELECT t.id, t.status, t.attempt, t.runtime_id, t.dispatched_at, r.state, r.attempt, r.sent_at, "
                "r.expires_at FROM task_runs t LEFT JOIN reservations r ON r.task_id = t.id "
                "WHERE t.status NOT IN ('succeeded', 'failed', 'cancelled', 'timed_out') LIMIT 20"))).all()
        by_id = {r.id: r for r in rows}
        not_terminal = [r for r in rows if r.status not in TERMINAL or r.outcome is None or r.finished_at is None]
        missing = [t for t in stats.submitted if t not in by_id]
        outcomes: dict[str, int] = {}
        for r in rows:
            outcomes[r.status] = outcomes.get(r.status, 0) + 1
        lost_runtime = sum(1 for r in rows if r.error and "runtime lost" in r.error)

        # firings: one row per nominal time; the first at the moved-in time; none missing after it
        per: dict[str, list] = {sid: [] for sid in sched_ids}
        for f in fir:
            per[f.schedule_id].append(f)
        gaps, doubles, due_late, wrong_first = [], 0, [], []
        for sid, fs in per.items():
            times = [f.nominal_time for f in fs]
            doubles += len(times) - len(set(times))
            if first[sid] < cutoff - timedelta(seconds=5) and (not fs or fs[0].nominal_time != first[sid]):
                wrong_first.append((sid, first[sid].isoformat(), fs[0].nominal_time.isoformat() if fs else None))
            for a, b in zip(fs, fs[1:]):
                if (b.nominal_time - a.nominal_time).total_seconds() > INTERVAL_S * (1 + (a.missed_count or 0)) + 1:
                    gaps.append((sid, a.nominal_time.isoformat(), b.nominal_time.isoformat()))
            if fs and cutoff - fs[-1].nominal_time > timedelta(seconds=INTERVAL_S * 2 + 2):
                due_late.append((sid, fs[-1].nominal_time.isoformat()))
        task_ids = [f.task_id for f in fir if f.task_id]
        fired_twice = len(task_ids) - len(set(task_ids))
        admissions: dict[str, int] = {}
        for f in fir:
            key = f"{(f.admission or 'none')[:60]}/{f.outcome}"
            admissions[key] = admissions.get(key, 0) + 1

        # notices: each sent one is in the Feishu log exactly once, under its own uuid; nothing left unsent
        log_uuids = [m.uuid for m in fake.sent]
        by_uuid = {n.request_uuid: n for n in notices}
        sent_twice = len(log_uuids) - len(set(log_uuids))
        unknown_uuid = [u for u in log_uuids if u not in by_uuid]
        sends = [n for n in notices if n.kind != "update"]
        sent_rows = [n for n in sends if n.state == "sent"]
        not_in_log = [n.id for n in sent_rows if log_uuids.count(n.request_uuid) != 1]
        unsent = [n.id for n in notices if n.state == LIVE and n.due]  # a digest waits for its slot: not yet due
        notice_states: dict[str, int] = {}
        for n in notices:
            notice_states[f"{n.kind}:{n.state}"] = notice_states.get(f"{n.kind}:{n.state}", 0) + 1

        ready = [await fleet.ready(i) for i in range(3)]
        # A runner whose connection the last fault cut may be between reconnects (`hub.backoff.RECONNECT`, at most
        # 3 s apart): every runner is online again within a bounded time, not at this very instant.
        with contextlib.suppress(AssertionError):
            await until(lambda: _is_superset(online(), expected), 30, 0.5)
        back_online = await online()
        if not expected <= back_online:  # say why: the runtime row, and whether the runner's loop ended
            async with engine.connect() as conn:
                st = dict((await conn.execute(sa.select(runtimes.c.name, runtimes.c.status))).all())
            for r, t in fleet.sims:
                if r.name not in back_online:
                    why = (repr(t.exception()) if t.done() and not t.cancelled() and t.exception() else
                           "loop ended" if t.done() else f"loop running, connected={r.ws is not None}")
                    print(f"runner {r.name}: runtime {st.get(r.name)}; {why}")
            for i, proc in enumerate(fleet.runners):
                if f"real-{i}" not in back_online:
                    print(f"runner real-{i}: runtime {st.get(f'real-{i}')}; process "
                          f"{'running' if proc is not None and proc.returncode is None else 'exited'}; its log is "
                          f"{tmp_path / f'runner{i}.log'}")
        lat = [(r.started_at - r.created_at).total_seconds() for r in rows if r.started_at and r.created_at]
        e2e = [(r.finished_at - r.created_at).total_seconds() for r in rows if r.finished_at and r.created_at]
        terminal = len(rows) - len(not_terminal)
        print("\n=== soak summary ===", flush=True)
        print(f"load {load_s:.0f}s (drain {drain_s:.1f}s; whole test {time.monotonic() - t_test:.0f}s), "
              f"{len(fleet.ports)} hub replicas, 2 real + {SIM_RUNNERS} simulated runners, {SCHEDULES} schedules "
              f"every {INTERVAL_S}s ({len(range(0, SCHEDULES, FAILING_EVERY))} failing)")
        by_mcp = sum(v == 'mcp' for v in stats.submitted.values())
        print(f"tasks: {len(stats.submitted)} submitted by clients ({by_mcp} MCP, "
              f"{sum(v == 'rest' for v in stats.submitted.values())} REST), {stats.submit_errors} submit calls failed "
              f"during faults; {len(rows)} task rows in all (schedules included): {outcomes}; "
              f"{lost_runtime} failed 'runtime lost' (the killed runner's)")
        print(f"tasks not terminal: {len(not_terminal)} (open when the load stopped: {backlog}); "
              f"submitted but absent: {len(missing)}")
        print(f"throughput {terminal / (load_s + drain_s):.1f} tasks/s to terminal; "
              f"submit->running p50 {pct(lat, .5) * 1000:.0f} ms "
              f"p99 {pct(lat, .99) * 1000:.0f} ms; submit->terminal p99 {pct(e2e, .99):.2f} s")
        unknown = sum(1 for f in fir if f.admission is None and f.outcome == "unknown")
        print(f"firings: {len(fir)} rows {admissions}; {unknown} claimed but never admitted (outcome 'unknown': "
              f"the replica died between claim and admission, never fired again); doubled nominal times {doubles}; "
              f"gaps {len(gaps)}; "
              f"first nominal time not fired {len(wrong_first)}; schedules behind at the end {len(due_late)}; "
              f"one task fired for two firings {fired_twice}")
        print(f"notices: {len(notices)} rows {notice_states}; Feishu log {len(fake.sent)} messages, "
              f"{len(set(log_uuids))} uuids; sent twice {sent_twice}; sent rows not in the log once {len(not_in_log)}; "
              f"log messages of no notice {len(unknown_uuid)}; still unsent {len(unsent)}")
        print(f"leases: {stats.lease_races} takeover races, {stats.lease_double_live} with two live handles, "
              f"{stats.lease_errors} calls failed during faults")
        print(f"replicas ready {ready}; runners online {len(back_online & expected)}/{len(expected)}; "
              f"{stats.startup_exits} replica starts died and were restarted")
        for k, v in stats.recovery.items():
            print(f"recovery: {k}: " + ", ".join(f"{x:.1f}" for x in v))
        for e in stats.events:
            print(f"  {e}")
        if not_terminal:
            for d in stuck_detail:
                print(f"  not terminal: {tuple(d)}")

        assert not not_terminal, [(r.id, r.status) for r in not_terminal[:10]]
        assert not missing, missing[:10]
        assert doubles == 0 and fired_twice == 0
        assert not gaps, gaps[:10]
        assert not wrong_first, wrong_first[:10]
        assert not due_late, due_late[:10]
        assert sent_twice == 0 and not unknown_uuid and not not_in_log, (sent_twice, unknown_uuid[:5], not_in_log[:5])
        assert not unsent, unsent[:10]
        assert sent_rows, "no notice reached the Feishu log: the failing schedules' notices are what is checked"
        assert stats.lease_double_live == 0
        assert all(ready), ready
        assert expected <= back_online, sorted(expected - back_online)
        assert len(stats.submitted) > 0 and stats.lease_races > 0
        passed = True
    finally:
        stop.set()
        for w in workers:
            w.cancel()
        await fleet.stop()
        await proxy.stop()
        await fake.stop()
        await engine.dispose()
        await asyncio.to_thread(pg.purge)
        logging.getLogger("amux.runner").removeHandler(sim_log)
        sim_log.close()
        if passed:
            shutil.rmtree(tmp_path, ignore_errors=True)
        else:
            print(f"soak: hub and runner logs kept in {tmp_path}", flush=True)


async def _is_superset(awaitable, expected: set[str]) -> bool:
    return expected <= await awaitable


async def _eq(awaitable, value) -> bool:
    return (await awaitable) == value
