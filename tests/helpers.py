"""Shared test helpers: databases on both backends, a real hub on a real port, runners, MCP clients."""
from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import shutil
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import httpx2
import sqlalchemy as sa
from aiohttp import web
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.types import Implementation
from sqlalchemy.ext.asyncio import create_async_engine

from hub.app import Hub
from hub.clock import Clock, ManualClock
from hub.config import Settings
from hub.config_sources import load_settings
from hub.engines.scripted import ScriptedEngine
from hub.runner.agent import Runner
from hub.store.db import Database, normalize_url, upgrade_sync

# How long a test waits for a process it started (a hub, a runner, a fake server) to come up. Under load a start
# takes long, and a slow start is not what any test checks, so no such wait is shorter: `started` / `started_sync`.
PROCESS_START_S = 120.0

PG_URL = normalize_url(os.environ.get("AMUX_TEST_DATABASE_URL") or "postgresql+asyncpg://postgres@127.0.0.1:5432/test")
REPO = Path(__file__).resolve().parent.parent


class Databases:
    """Migrated template databases, copied per test (a file copy on SQLite, CREATE DATABASE … TEMPLATE on PG)."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self.sqlite_template = tmp / "template.db"
        self.pg_template: str | None = None
        self.pg_admin = PG_URL
        upgrade_sync(f"sqlite+aiosqlite:///{self.sqlite_template}")  # built outside any event loop

    def sqlite(self) -> str:
        """Return the URL of a fresh, migrated SQLite database."""
        path = self.tmp / f"t_{uuid.uuid4().hex[:10]}.db"
        shutil.copy(self.sqlite_template, path)
        return f"sqlite+aiosqlite:///{path}"

    async def _admin(self, sql: str) -> None:
        engine = create_async_engine(self.pg_admin, isolation_level="AUTOCOMMIT")
        try:
            async with engine.connect() as conn:
                await conn.execute(sa.text(sql))
        finally:
            await engine.dispose()

    def _url_for(self, name: str) -> str:
        return str(sa.engine.make_url(self.pg_admin).set(database=name).render_as_string(hide_password=False))

    async def postgres(self) -> str:
        """Return the URL of a fresh, migrated PostgreSQL database."""
        if self.pg_template is None:
            name = f"amux_tpl_{os.getpid()}_{uuid.uuid4().hex[:6]}"
            await self._admin(f'CREATE DATABASE "{name}"')
            await asyncio.to_thread(upgrade_sync, self._url_for(name))
            self.pg_template = name
        name = f"amux_t_{uuid.uuid4().hex[:12]}"
        await self._admin(f'CREATE DATABASE "{name}" TEMPLATE "{self.pg_template}"')
        return self._url_for(name)

    async def drop(self, url: str) -> None:
        """Drop a PostgreSQL test database."""
        name = sa.engine.make_url(url).database
        await self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    async def drop_template(self) -> None:
        """Drop the template at session end."""
        if self.pg_template:
            await self._admin(f'DROP DATABASE IF EXISTS "{self.pg_template}" WITH (FORCE)')


# The runner of most tests: process mode on a runner declared dedicated, as the hub's uid (the hub allows it, see
# hub_settings). The linux-dac boundary has its own suite (tests/integration/test_task_child_boundary.py).
PROCESS_MODE: dict[str, Any] = {"dedicated": True, "isolation": ["process"]}


def hub_settings(db_url: str, home: Path, **hub_overrides: Any) -> Settings:
    """Settings for a test hub: fast polling, the given database."""
    s = load_settings(env={}, home=str(home), database_url=db_url)
    s.hub.poll_s = 0.05
    s.schedules.min_interval_s = 0  # tests fire second-long rules; test_fair_sharing.py covers the 60 s default
    s.execution.allow_process_on_hub = True  # the suite's runners share the hub's uid (PROCESS_MODE)
    for k, v in hub_overrides.items():
        setattr(s.hub, k, v)
    return s


STOP_S = 120.0  # a runner not stopped by then is stuck: the teardown fails, naming it, instead of hanging


@dataclass
class HubHandle:
    """A hub serving on a real port."""

    hub: Hub
    url: str
    admin_token: str
    site_runner: web.AppRunner
    runners: list[tuple[Runner, asyncio.Task]] = field(default_factory=list)

    @property
    def clock(self) -> Clock:
        return self.hub.clock

    async def token(self, principal: str, label: str | None = None, admin: bool = False) -> str:
        """Create a token."""
        return await self.hub.auth.create_token(principal, label=label, admin=admin)

    async def start_runner(self, name: str = "r1", slots: int = 4, workspace: Path | None = None,
                           token: str | None = None) -> Runner:
        """Start an in-process runner over the real WebSocket and wait until it registered."""
        ws = workspace or Path(self.hub.settings.home) / "ws" / name
        runner = Runner(self.url, token or self.admin_token, name=name, slots=slots, workspace_root=ws, **PROCESS_MODE,
                        engines={"scripted": ScriptedEngine()})
        task = asyncio.create_task(runner.run_forever())
        self.runners.append((runner, task))
        await started(runner.registered.wait(), f"runner {name} to register")
        return runner

    async def stop(self) -> None:
        """Stop runners, the site and the database pool."""
        for runner, task in self.runners:
            await asyncio.wait_for(runner.stop(), STOP_S)
            task.cancel()
            done, _ = await asyncio.wait({task}, timeout=STOP_S)  # not `await task`: a task that ignores its
            if not done:                                           # cancellation would hang the suite
                raise AssertionError(f"runner {runner.name} did not stop within {STOP_S:.0f} s of being cancelled "
                                     f"(held: {sorted(runner.held)})")
            with contextlib.suppress(asyncio.CancelledError, Exception):
                task.result()
        await self.site_runner.cleanup()
        await self.hub.db.close()


async def start_hub(db_url: str, home: Path, clock: Clock | None = None, port: int = 0,
                    background: bool = True, feishu_apps: list | None = None, **hub_overrides: Any) -> HubHandle:
    """Start a hub on 127.0.0.1 with an admin token (and the given `[[feishu.apps]]`)."""
    settings = hub_settings(db_url, home, **hub_overrides)
    settings.feishu.apps = list(feishu_apps or [])
    hub = Hub(settings, Database(db_url), clock or ManualClock())
    site_runner = hub.app_runner(background=background)
    await site_runner.setup()
    site = web.TCPSite(site_runner, "127.0.0.1", port)
    await site.start()
    real_port = site._server.sockets[0].getsockname()[1]
    admin = await hub.auth.create_token("admin", label="cli", admin=True)
    hub.runner_dispatch.hub_url = f"http://127.0.0.1:{real_port}"  # what children are told (public_url in production)
    return HubHandle(hub, f"http://127.0.0.1:{real_port}", admin, site_runner)


@contextlib.asynccontextmanager
async def mcp_client(url: str, token: str | None, name: str = "pytest", mode: str = "auto") -> AsyncIterator[Client]:
    """Connect the official MCP SDK client to the hub's /mcp with a bearer token."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http:
        async with Client(streamable_http_client(f"{url}/mcp", http_client=http),
                          client_info=Implementation(name=name, version="1.0"), mode=mode) as client:
            yield client


def runner_command(url: str, token: str, name: str, slots: int, workspace: Path) -> list[str]:
    """Return argv for a real `amux runner` subprocess; its token goes in a private file beside the workspace
    (`--token-file`: argv is readable by every local user)."""
    token_file = workspace.parent / f"{name}.runner-token"
    token_file.parent.mkdir(parents=True, exist_ok=True)
    token_file.touch(mode=0o600)
    token_file.write_text(token + "\n")
    return [sys.executable, "-m", "hub.cli", "runner", "--hub", url, "--token-file", str(token_file),
            "--name", name, "--slots", str(slots), "--workspace-root", str(workspace), "--dedicated",
            "--isolation", "process"]


async def eventually(predicate, timeout: float = 10.0, interval: float = 0.02):
    """Poll an async predicate until it returns a truthy value (for real I/O, not rule durations)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = await predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"condition not met within {timeout}s (last value {value!r})")
        await asyncio.sleep(interval)


def _exited(proc: Any) -> int | None:
    """Return the exit code of a process (asyncio or subprocess.Popen) that has ended, else None."""
    if proc is None:
        return None
    return proc.poll() if isinstance(proc, subprocess.Popen) else proc.returncode


async def started(ready: Callable[[], Awaitable[Any]] | Awaitable[Any], what: str, *, proc: Any = None,
                  timeout: float = PROCESS_START_S, interval: float = 0.05) -> Any:
    """Wait for a process to come up: the one helper for every such wait in the suite (not for timing assertions).

    `ready` is an async predicate, polled until it returns something truthy (returned), or an awaitable such as
    `runner.registered.wait()`. The wait is at least PROCESS_START_S; it fails at once, naming `what`, when `proc`
    (the process being started) exits first.
    """
    timeout = max(timeout, PROCESS_START_S)
    if not callable(ready):
        awaited = asyncio.ensure_future(ready)
        try:
            async def done() -> bool:
                return awaited.done()

            await started(done, what, proc=proc, timeout=timeout, interval=interval)
            return awaited.result()
        finally:
            awaited.cancel()
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    value = None
    while loop.time() <= deadline:
        value = ready()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        code = _exited(proc)
        if code is not None:
            raise AssertionError(f"waiting for {what}: the process exited with code {code} before it was up")
        await asyncio.sleep(interval)
    raise AssertionError(f"{what} did not happen within {timeout:g} s of starting (last value {value!r})")


def started_sync(ready: Callable[[], Any], what: str, *, proc: Any = None, timeout: float = PROCESS_START_S,
                 interval: float = 0.05) -> Any:
    """`started` for tests without an event loop: poll `ready()` until truthy, at least PROCESS_START_S."""
    deadline = time.monotonic() + max(timeout, PROCESS_START_S)
    value = None
    while time.monotonic() <= deadline:
        value = ready()
        if value:
            return value
        code = _exited(proc)
        if code is not None:
            raise AssertionError(f"waiting for {what}: the process exited with code {code} before it was up")
        time.sleep(interval)
    raise AssertionError(f"{what} did not happen within {max(timeout, PROCESS_START_S):g} s of starting "
                         f"(last value {value!r})")


# The runner protocol's production doors, as the runner endpoint uses them: one batch of reports through
# `RunnerReports.apply`, and what a connection sends through `outgoing_many`. Each helper reads its reply.

async def runner_outgoing(dispatch: Any, runtime_id: str, conn_id: str, cancels_sent: set[tuple[str, int]],
                          token_id: str | None = None) -> list[dict]:
    """What this connection sends now (dispatches marked sent); the connection must not be one to close."""
    from hub.services.tasks.dispatch import Link

    due = await dispatch.outgoing_many([Link(runtime_id=runtime_id, conn_id=conn_id, token_id=token_id,
                                             cancels_sent=cancels_sent)])
    assert conn_id not in due.revoked | due.stale, due
    return due.messages.get(conn_id, [])


async def runner_accepted(reports: Any, runtime_id: str, msg: Any) -> str:
    """Apply one Accepted; 'ok', 'cancel' (the hub answered with a cancel) or 'drop'."""
    replies = await reports.apply(runtime_id, "", [msg])
    if replies[0]["drop"]:
        return "drop"
    return "cancel" if any(r["type"] == "cancel" for r in replies) else "ok"


async def runner_events(reports: Any, runtime_id: str, msg: Any) -> int | None:
    """Apply one Events; the acknowledged runner sequence, None when the task is not this runner's."""
    ack = (await reports.apply(runtime_id, "", [msg]))[0]
    return None if ack["drop"] else ack["rseq"]


async def runner_finished(reports: Any, runtime_id: str, msg: Any) -> bool:
    """Apply one Finished; False when the task is not this runner's."""
    return not (await reports.apply(runtime_id, "", [msg]))[0]["drop"]


async def turn_child_env(hub: Hub, conn: Any, owner_id: str, session_id: str) -> dict[str, str]:
    """The coordination environment the child of a Session's running Turn is given at dispatch: a fresh run token of
    that Turn (earlier ones revoked, as a dispatch sent again does), labeled for the Session, and its address."""
    from hub.domain.tasks import Status
    from hub.services.tasks.dispatch import run_label
    from hub.store.tables import task_runs

    task_id = (await conn.execute(sa.select(task_runs.c.id).where(
        task_runs.c.session_id == session_id, task_runs.c.status.in_([Status.DISPATCHED.value, Status.RUNNING.value]))
        .order_by(task_runs.c.turn_seq.desc()).limit(1))).scalar()
    token = await hub.auth.mint_run(conn, owner_id, task_id, run_label(session_id, task_id))
    return {"AMUX_HUB_URL": hub.runner_dispatch.hub_url, "AMUX_TOKEN": token, "AMUX_SESSION_ID": session_id}
