"""Long-connection mode: one hub replica at a time holds an application's connection (a lease row)."""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import sys
from pathlib import Path

import pytest

from bot.core import FeishuBot
from bot.feishu.longconn import LongConnections
from hub.app import Hub
from hub.clock import ManualClock
from hub.config import FeishuAppSettings
from hub.services.chat.bot import BotService
from hub.store.bot import SqlBotStore
from hub.store.db import Database
from tests.fakes.feishu_ws import FakeFeishuWs
from tests.helpers import REPO, eventually, hub_settings, started


async def test_only_one_replica_holds_the_long_connection_and_another_takes_over_after_expiry(
        db_url: str, tmp_path: Path, clock: ManualClock):
    settings = hub_settings(db_url, tmp_path)
    settings.feishu.apps = [FeishuAppSettings(app_id="cli_ws", app_secret="s", mode="long-connection")]
    hubs = [Hub(settings, Database(db_url), clock) for _ in range(2)]
    started: list[str] = []
    conns = [LongConnections(FeishuBot(h.bot_services), h.bot_services, lease_s=30, holder=f"r{i}",
                             starter=lambda app, loop, i=i: started.append(f"r{i}"))
             for i, h in enumerate(hubs)]
    try:
        assert await conns[0].claim("cli_ws") is True
        assert await conns[1].claim("cli_ws") is False
        clock.advance(20)
        assert await conns[0].claim("cli_ws") is True              # renewal by the holder
        clock.advance(20)
        assert await conns[1].claim("cli_ws") is False             # still held (renewed 20 s ago)
        clock.advance(31)                                          # the holder went quiet: the lease expired
        assert await conns[1].claim("cli_ws") is True
        assert await conns[0].claim("cli_ws") is False
        assert started == []
        conns[1].start()                                           # the keeper of the holder starts the client once
        conns[0].start()
        import asyncio
        for _ in range(50):
            if started:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)
        assert started == ["r1"]
        await conns[0].stop()
        await conns[1].stop()
    finally:
        for h in hubs:
            await h.db.close()


async def test_an_event_frame_on_the_long_connection_reaches_the_bot_through_the_sdk_dispatcher(
        sqlite_url: str, tmp_path: Path, clock: ManualClock):
    import asyncio
    import json

    from bot.console import ConsoleSink

    settings = hub_settings(sqlite_url, tmp_path)
    app = FeishuAppSettings(app_id="cli_wsev", app_secret="s", mode="long-connection", admin_open_id="ou_boss")
    settings.feishu.apps = [app]
    hub = Hub(settings, Database(sqlite_url), clock)
    sink = ConsoleSink()
    bot = FeishuBot(hub.bot_services, messenger=sink)
    conns = LongConnections(bot, hub.bot_services, holder="r0", starter=lambda app, loop: None)
    try:
        handler = conns.event_handler(app, asyncio.get_running_loop())
        frame = {"schema": "2.0",
                 "header": {"event_id": "ev_ws_1", "event_type": "im.message.receive_v1", "app_id": "cli_wsev",
                            "create_time": str(int(clock.now().timestamp() * 1000)), "token": ""},
                 "event": {"sender": {"sender_id": {"open_id": "ou_alice"}, "sender_type": "user"},
                           "message": {"message_id": "om_ws_1", "chat_id": "oc_ws", "chat_type": "p2p",
                                       "message_type": "text", "content": json.dumps({"text": "/amux"})}}}
        # The SDK's websocket client calls this on its own thread for every EVENT frame.
        await asyncio.to_thread(handler._do_without_validation, json.dumps(frame).encode())
        for _ in range(200):
            if sink.replies:
                break
            await asyncio.sleep(0.02)
        assert sink.replies and sink.replies[0]["msg_type"] == "interactive"
        assert sink.replies[0]["reply_to"] == "om_ws_1"
        await asyncio.to_thread(handler._do_without_validation, json.dumps(frame).encode())  # a redelivered frame
        await asyncio.sleep(0.2)
        assert len(sink.replies) == 1
    finally:
        await hub.db.close()


# ---------------------------------------------------------------- losing the lease, per-thread loops, supervision

APP_WS = FeishuAppSettings(app_id="cli_ws", app_secret="s", mode="long-connection")


class RecordedLink:
    """A client as a starter returns it: records that the keeper stopped it."""

    def __init__(self, name: str, log: list[str]) -> None:
        self.name, self.log, self.stopped = name, log, False

    def alive(self) -> bool:
        return not self.stopped

    def stop(self) -> None:
        self.stopped = True
        self.log.append(f"stop {self.name}")

    def join(self, timeout: float) -> None:
        pass


def recording_starter(name: str, log: list[str]):
    def start(app, loop):
        log.append(f"start {name}")
        return RecordedLink(name, log)
    return start


async def test_a_replica_that_finds_its_lease_taken_over_stops_its_client_and_the_new_holder_runs_one(
        db_url: str, tmp_path: Path, clock: ManualClock):
    settings = hub_settings(db_url, tmp_path)
    settings.feishu.apps = [APP_WS]
    hubs = [Hub(settings, Database(db_url), clock) for _ in range(2)]
    log: list[str] = []
    conns = [LongConnections(FeishuBot(h.bot_services), h.bot_services, lease_s=30, holder=f"r{i}",
                             starter=recording_starter(f"r{i}", log))
             for i, h in enumerate(hubs)]
    try:
        await conns[0].keep(APP_WS)
        await conns[1].keep(APP_WS)
        assert log == ["start r0"]
        clock.advance(31)                            # r0 went quiet (a pause, a partition): its lease expired
        await conns[1].keep(APP_WS)                  # r1 takes over and starts its client
        await conns[0].keep(APP_WS)                  # r0 comes back: the lease is r1's, so r0 stops its client
        assert log == ["start r0", "start r1", "stop r0"]
        assert conns[0].running == set() and conns[1].running == {"cli_ws"}
        await conns[0].keep(APP_WS)
        await conns[1].keep(APP_WS)                  # renewals change nothing
        assert log == ["start r0", "start r1", "stop r0"]
    finally:
        for h in hubs:
            await h.db.close()


class FailingLeases(BotService):
    """The hub's lease service, failing its next `failures` claims as a lost database would."""

    def __init__(self, hub: Hub, failures: int = 0) -> None:
        super().__init__(hub.db, hub.clock, hub.sessions)
        self.failures = failures

    async def claim_lease(self, name: str, holder: str, lease_s: float) -> bool:
        if self.failures:
            self.failures -= 1
            raise ConnectionError("the database cannot be reached")
        return await super().claim_lease(name, holder, lease_s)


async def test_a_replica_that_cannot_renew_its_lease_before_it_expires_stops_its_client(
        sqlite_url: str, tmp_path: Path, clock: ManualClock):
    settings = hub_settings(sqlite_url, tmp_path)
    settings.feishu.apps = [APP_WS]
    hub = Hub(settings, Database(sqlite_url), clock)
    log: list[str] = []
    leases = FailingLeases(hub)
    conns = LongConnections(FeishuBot(hub.bot_services), hub.bot_services, lease_s=30, holder="r0",
                            starter=recording_starter("r0", log),
                            service=leases)
    try:
        await conns.keep(APP_WS)
        leases.failures = 2
        clock.advance(10)
        with pytest.raises(ConnectionError):         # not renewed, but the lease is still ours: keep the client
            await conns.keep(APP_WS)
        assert log == ["start r0"]
        clock.advance(21)
        with pytest.raises(ConnectionError):         # past the lease: another replica may hold it now, so stop
            await conns.keep(APP_WS)
        assert log == ["start r0", "stop r0"] and conns.running == set()
        await conns.keep(APP_WS)                     # the database is back and the lease free: start again
        assert log == ["start r0", "stop r0", "start r0"]
    finally:
        await hub.db.close()


async def test_each_keeper_is_a_supervised_loop_a_failed_pass_is_counted_and_the_next_one_takes_the_lease(
        sqlite_url: str, tmp_path: Path, clock: ManualClock):
    settings = hub_settings(sqlite_url, tmp_path)
    settings.feishu.apps = [APP_WS]
    hub = Hub(settings, Database(sqlite_url), clock)
    log: list[str] = []
    conns = LongConnections(FeishuBot(hub.bot_services), hub.bot_services, lease_s=0.3, holder="r0",
                            starter=recording_starter("r0", log),
                            service=FailingLeases(hub, failures=1))
    try:
        conns.start()
        await eventually(lambda: _true(log == ["start r0"]), timeout=10)
        state = conns.loops.loops["longconn:cli_ws"]
        assert state.failures == 1 and "the database cannot be reached" in state.last_error
        assert state.task is not None and not state.task.done()  # held by the supervisor, still running
        await conns.stop()
        assert log == ["start r0", "stop r0"] and state.task.done()
        async with hub.db.read() as conn:                        # released on stop: no waiting for expiry
            assert await SqlBotStore(hub.db).lease_holder(conn, "longconn:cli_ws") is None
    finally:
        await hub.db.close()


async def _true(value: bool) -> bool:
    return value


def _message(app_id: str, n: int, clock: ManualClock) -> dict:
    return {"schema": "2.0",
            "header": {"event_id": f"ev_{app_id}_{n}", "event_type": "im.message.receive_v1", "app_id": app_id,
                       "create_time": str(int(clock.now().timestamp() * 1000)), "token": ""},
            "event": {"sender": {"sender_id": {"open_id": "ou_alice"}, "sender_type": "user"},
                      "message": {"message_id": f"om_{app_id}_{n}", "chat_id": "oc_ws", "chat_type": "p2p",
                                  "message_type": "text", "content": json.dumps({"text": "/amux"})}}}


async def test_two_long_connection_clients_in_one_replica_each_run_on_their_own_loop_and_both_answer_events(
        sqlite_url: str, tmp_path: Path, clock: ManualClock):
    from bot.console import ConsoleSink

    fake = await FakeFeishuWs().start()
    apps = [FeishuAppSettings(app_id=a, app_secret="s", mode="long-connection", base_url=fake.base_url)
            for a in ("cli_wsa", "cli_wsb")]
    settings = hub_settings(sqlite_url, tmp_path)
    settings.feishu.apps = apps
    hub = Hub(settings, Database(sqlite_url), clock)
    sink = ConsoleSink()
    conns = LongConnections(FeishuBot(hub.bot_services, messenger=sink), hub.bot_services, holder="r0")
    loop = asyncio.get_running_loop()
    links = []
    try:
        for app in apps:  # one after the other: the second thread's start must not take over the first's loop
            links.append(conns.start_client(app, loop))
            await started(lambda app=app: _true(len(fake.open(app.app_id)) == 1), f"the {app.app_id} client thread")
        for n, app in enumerate(apps):
            (conn,) = fake.open(app.app_id)
            await fake.push_event(conn, f"m{n}", _message(app.app_id, n, clock))
            assert (await fake.answer(conn, f"m{n}"))["code"] == 200
        await eventually(lambda: _true(len(sink.replies) == 2), timeout=10)
        assert sorted(r["reply_to"] for r in sink.replies) == ["om_cli_wsa_0", "om_cli_wsb_1"]
    finally:
        for link in links:
            link.stop()
        for link in links:
            await asyncio.to_thread(link.join, 10)
        await eventually(lambda: _true(not fake.open()), timeout=10)  # stopping a client closes its connection
        assert not any(link.alive() for link in links)
        await fake.stop()
        await hub.db.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_a_hub_process_that_lost_the_lease_closes_its_connection_and_the_other_process_holds_the_only_one(
        pg_url: str, tmp_path: Path):
    fake = await FakeFeishuWs().start()
    db = Database(pg_url)
    procs: list[asyncio.subprocess.Process] = []
    ports = [free_port(), free_port()]
    try:
        for i, port in enumerate(ports):
            home = tmp_path / f"h{i}"
            home.mkdir()
            (home / "amux.toml").write_text(f"""
[feishu]
long_connection_lease_s = 1.5
[[feishu.apps]]
app_id = "cli_lc"
app_secret = "s"
mode = "long-connection"
base_url = "{fake.base_url}"
""")
            procs.append(await asyncio.create_subprocess_exec(
                sys.executable, "-m", "hub.cli", "hub", "serve", "--db", pg_url, "--listen", f"127.0.0.1:{port}",
                cwd=REPO, env={**os.environ, "AMUX_HOME": str(home)},
                stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL))
        store = SqlBotStore(db)

        async def holder_pid() -> int | None:
            async with db.read() as conn:
                lease = await store.lease_holder(conn, "longconn:cli_lc")
            return int(lease[0].split(":")[-2]) if lease else None

        await started(lambda: _true(len(fake.open()) == 1), "a hub process connected to Feishu", interval=0.1)
        first = fake.open()[0]
        pid_a = await holder_pid()
        assert pid_a in {p.pid for p in procs}
        os.kill(pid_a, signal.SIGSTOP)               # the holder freezes: it stops renewing, its socket stays open

        async def taken_over() -> bool:
            return await holder_pid() not in (None, pid_a) and len(fake.open()) == 2

        await eventually(taken_over, timeout=20, interval=0.1)
        os.kill(pid_a, signal.SIGCONT)               # it wakes up to find the lease someone else's
        await eventually(lambda: _true(not first.open), timeout=20, interval=0.1)
        (second,) = fake.open()
        assert second.number > first.number and await holder_pid() not in (None, pid_a)
        assert len(fake.connections) == 2            # the woken replica did not connect again
    finally:
        for p in procs:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGCONT)
                p.kill()
            await p.wait()
        await db.close()
        await fake.stop()
