"""At most once, and the record says so (issue 28): two `amux hub serve` replicas on a PostgreSQL cluster of the
test's own, two real `amux runner` processes reaching them through a failover proxy, and an engine that appends
each of its starts to a ledger outside the hub. Faults: a runner stopped (SIGSTOP) for longer than the reservation
TTL but shorter than the hub's silence limit; both replicas killed for longer than the TTL; PostgreSQL stopped.

From the ledger: no task's engine started more than once, none was lost, none is stuck. From the database: every
task succeeded exactly when, and only because, the ledger shows its engine ran.
"""
from __future__ import annotations

import asyncio
import collections
import contextlib
import os
import shlex
import signal
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from hub.store.tables import reservations, runtimes, task_runs
from tests.helpers import REPO, mcp_client, runner_command, started
from tests.integration.test_soak import Postgres, Proxy, free_port, until

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the throwaway PostgreSQL cluster is started as root here")

TTL_S = 3.0
HEARTBEAT_S = 2.0  # the hub closes a runner's connection after 3 silent heartbeats (6 s)
STOP_S = 4.5       # > TTL, < the silence limit
LONG_STOP_S = 8.0  # > the silence limit, < runtime_lost_s
TASKS = 24
BURST = 6          # submitted while a runner is stopped
HUB_ENV = {"AMUX_HUB__POLL_S": "0.1", "AMUX_HUB__HEARTBEAT_S": str(HEARTBEAT_S),
           "AMUX_HUB__RESERVATION_TTL_S": str(TTL_S), "AMUX_HUB__RUNTIME_LOST_S": "30",
           "AMUX_HUB__MAX_PENDING_PER_CLIENT": "0", "AMUX_HUB__MAX_CONNECTIONS_PER_CLIENT": "0",
           "AMUX_EXECUTION__ALLOW_PROCESS_ON_HUB": "1"}

LEDGER_AGENT = '''#!{python}
"""Speaks Claude's stream-json; appends its start to the ledger, sleeps the prompt's seconds, answers."""
import json, os, sys, time
prompt = None
for line in sys.stdin:
    msg = json.loads(line)
    if msg.get("type") == "user":
        prompt = msg["message"]["content"]
        break
with open({ledger!r}, "a") as f:
    f.write(f"{{os.path.basename(os.getcwd())}} {{os.getpid()}} {{time.time():.3f}}\\n")
    f.flush()
    os.fsync(f.fileno())
time.sleep(float(prompt))
sid = "00000000-0000-4000-8000-00000000f00d"
print(json.dumps({{"type": "system", "subtype": "init", "session_id": sid, "mcp_servers": []}}), flush=True)
print(json.dumps({{"type": "result", "subtype": "success", "is_error": False, "result": "ran", "session_id": sid}}),
      flush=True)
'''


class Cluster:
    """The replicas and the runners."""

    def __init__(self, tmp: Path, db_url: str, agent: Path) -> None:
        self.tmp, self.db_url, self.agent = tmp, db_url, agent
        self.ports = [free_port(), free_port()]
        self.hubs: list[asyncio.subprocess.Process | None] = [None, None]
        self.runners: list[asyncio.subprocess.Process | None] = [None, None]
        self.secret = "amo-" + os.urandom(8).hex()

    async def start_hub(self, i: int) -> None:
        home = self.tmp / f"hub{i}"
        home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **HUB_ENV, "AMUX_HOME": str(home), "AMUX_SECRET_KEY": self.secret}
        log = open(self.tmp / f"hub{i}.log", "ab")  # noqa: SIM115
        self.hubs[i] = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hub.cli", "hub", "serve", "--db", self.db_url, "--listen",
            f"127.0.0.1:{self.ports[i]}", cwd=REPO, env=env, stdout=log, stderr=log)

    async def start_runner(self, i: int, url: str, token: str) -> None:
        log = open(self.tmp / f"runner{i}.log", "ab")  # noqa: SIM115
        env = {**os.environ, "AMUX_HOME": str(self.tmp / f"rhome{i}"), "AMUX_CLAUDE_BIN": str(self.agent)}
        self.runners[i] = await asyncio.create_subprocess_exec(
            *runner_command(url, token, f"amo-{i}", 3, self.tmp / f"ws{i}"), cwd=REPO, env=env, stdout=log,
            stderr=log)

    async def ready(self, i: int) -> bool:
        try:
            async with aiohttp.ClientSession() as http, http.get(f"http://127.0.0.1:{self.ports[i]}/readyz",
                                                               timeout=aiohttp.ClientTimeout(total=2)) as r:
                return r.status == 200
        except (aiohttp.ClientError, asyncio.TimeoutError):
            return False

    async def kill_hubs(self) -> None:
        for p in self.hubs:
            if p is not None and p.returncode is None:
                p.send_signal(signal.SIGKILL)
                await p.wait()

    async def stop(self) -> None:
        for p in [*self.runners, *self.hubs]:
            if p is not None and p.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p.pid, signal.SIGCONT)
                p.terminate()
        for p in [*self.runners, *self.hubs]:
            if p is not None:
                try:
                    await asyncio.wait_for(p.wait(), 10)
                except asyncio.TimeoutError:
                    p.kill()
                    await p.wait()


async def submitter(url: str, token: str, submitted: list[str], n: int, gap: float = 0.3) -> None:
    """Submit `n` tasks, one every `gap` s, retrying each until the hub answers (outages included)."""
    async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http:
        for k in range(n):
            body = {"prompt": str(0.5 + (k % 4) * 0.5), "profile": "claude", "name": f"amo-{k}"}
            while True:
                try:
                    async with http.post(f"{url}/api/v1/tasks", json=body,
                                         timeout=aiohttp.ClientTimeout(total=10)) as r:
                        if r.status in (200, 201):
                            submitted.append((await r.json())["task_id"])
                            break
                except (aiohttp.ClientError, asyncio.TimeoutError):
                    pass
                await asyncio.sleep(0.3)
            await asyncio.sleep(gap)


async def test_no_engine_runs_twice_through_a_runner_stall_a_hub_outage_and_a_database_stop_and_records_match():
    tmp = Path(tempfile.mkdtemp(prefix="amux-at-most-once-"))
    ledger = tmp / "ledger"
    agent = tmp / "ledger-agent"
    agent.write_text(LEDGER_AGENT.format(python=sys.executable, ledger=str(ledger)))
    agent.chmod(0o755)
    pg = Postgres()
    db_url = await asyncio.to_thread(pg.start)
    cluster = Cluster(tmp, db_url, agent)
    proxy = Proxy(cluster.ports)
    engine = create_async_engine(db_url, pool_pre_ping=True)
    submitted: list[str] = []
    passed = False
    try:
        for i in range(2):
            await cluster.start_hub(i)
        await started(lambda: _both(cluster), "both hub replicas", timeout=300, interval=0.2)
        await started(lambda: (tmp / "hub0" / "admin.token").exists(), "hub0 admin token")
        token = (tmp / "hub0" / "admin.token").read_text().strip()
        await proxy.start()
        url = f"http://127.0.0.1:{proxy.port}"
        for r in range(2):
            await cluster.start_runner(r, url, token)

        async def online() -> bool:
            async with engine.connect() as conn:
                names = set((await conn.execute(sa.select(runtimes.c.name).where(
                    runtimes.c.status == "online"))).scalars())
            return {"amo-0", "amo-1"} <= names

        await started(online, "runners amo-0 and amo-1 online", interval=0.2)
        load = asyncio.create_task(submitter(url, token, submitted, TASKS))

        # 1. A runner stalls past the reservation TTL, short of the hub's silence limit: dispatches sent to it
        #    meanwhile expire and go elsewhere; it reads them when it wakes. Then once past the silence limit.
        async def idle(name: str) -> bool:  # the runner holds nothing: what is sent to it next waits in its socket
            async with engine.connect() as conn:
                busy = (await conn.execute(sa.select(sa.func.count()).select_from(reservations).join(
                    runtimes, runtimes.c.id == reservations.c.runtime_id).where(
                    runtimes.c.name == name, reservations.c.state.in_(["pending", "committed"])))).scalar()
            return busy == 0

        for stall in (STOP_S, LONG_STOP_S):
            await until(lambda: idle("amo-0"), 60, interval=0.05)
            os.kill(cluster.runners[0].pid, signal.SIGSTOP)
            burst = asyncio.create_task(submitter(url, token, submitted, BURST, gap=0.05))
            await asyncio.sleep(stall)
            os.kill(cluster.runners[0].pid, signal.SIGCONT)
            await burst
        # 2. Both replicas die for longer than the TTL, then come back.
        await asyncio.sleep(1.0)
        await cluster.kill_hubs()
        await asyncio.sleep(TTL_S + 2)
        for i in range(2):
            await cluster.start_hub(i)
        await started(lambda: _both(cluster), "both hub replicas restarted", interval=0.2)
        # 3. The database stops for a while.
        await asyncio.sleep(1.0)
        c = pg.cluster
        port = db_url.rsplit(":", 1)[1].split("/")[0]
        async with mcp_client(url, token, name="outage") as client:
            assert await asyncio.to_thread(c.stop)
            # During the outage a tool answers a tool error naming the fix, never a bare error or an HTTP 500.
            answer = await client.call_tool("task_get", {"task_id": submitted[0]})
            text = " ".join(getattr(part, "text", "") for part in answer.content or [])
            assert answer.is_error and "retry in a few seconds" in text and "request id" in text, text
            await asyncio.sleep(3.0)
        opts = shlex.join(["-p", port, "-k", c.sock, "-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
        rc, out = await asyncio.to_thread(c.runner.run, [c.bin("pg_ctl"), "-D", c.data, "-l", c.logfile, "-w",
                                                         "-o", opts, "start"], cwd=c.base)
        assert rc == 0, out
        back = time.monotonic()
        await until(lambda: _both(cluster), 60)
        ready_after = time.monotonic() - back
        await asyncio.wait_for(load, 180)

        async def settled() -> bool:
            async with engine.connect() as conn:
                rows = (await conn.execute(sa.select(task_runs.c.status).where(
                    task_runs.c.id.in_(submitted)))).scalars().all()
            return len(rows) == len(submitted) and all(s in ("succeeded", "failed", "cancelled", "timed_out")
                                                       for s in rows)

        await until(settled, 180)
        starts = collections.Counter(line.split()[0] for line in ledger.read_text().splitlines())
        twice = {t: n for t, n in starts.items() if n > 1}
        assert not twice, f"engines started more than once: {twice}"
        async with engine.connect() as conn:
            rows = {r.id: r for r in (await conn.execute(sa.select(task_runs.c.id, task_runs.c.status,
                                                                    task_runs.c.error, task_runs.c.attempt)
                                                          .where(task_runs.c.id.in_(submitted)))).all()}
        assert len(submitted) == TASKS + 2 * BURST and set(rows) == set(submitted)
        for task_id, row in rows.items():
            assert (row.status == "succeeded") == (starts[task_id] == 1), (task_id, row, starts[task_id])
        assert all(r.status == "succeeded" for r in rows.values()), {t: (r.status, r.error) for t, r in rows.items()
                                                                     if r.status != "succeeded"}
        assert ready_after < 5, f"/readyz took {ready_after:.1f}s after the database was back"
        print(f"at-most-once: {len(submitted)} tasks, {sum(starts.values())} engine starts, "
              f"{sum(1 for r in rows.values() if r.attempt > 1)} placed again, ready {ready_after:.1f}s after the "
              f"database came back", flush=True)
        passed = True
    finally:
        await cluster.stop()
        await proxy.stop()
        await engine.dispose()
        pg.purge()
        if passed:
            import shutil
            shutil.rmtree(tmp, ignore_errors=True)
        else:
            print(f"at-most-once: logs kept in {tmp}", flush=True)


async def _both(cluster: Cluster) -> bool:
    return all([await cluster.ready(0), await cluster.ready(1)])
