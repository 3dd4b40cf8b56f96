"""Runner connections survive the store's bad moments and give up only when reconnecting cannot help."""
from __future__ import annotations

from datetime import timedelta

import asyncio
import sys

import sqlalchemy as sa
from sqlalchemy.exc import OperationalError

from hub.services.tasks.admission import SubmitRequest
from hub.store.tables import task_runs
from tests.helpers import PROCESS_MODE, REPO


class FailingFirst:
    """Fault injection at the store boundary: the first `n` calls raise what a restarting database raises."""

    def __init__(self, real, n: int) -> None:
        self.real, self.left, self.calls = real, n, 0

    async def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.left > 0:
            self.left -= 1
            raise OperationalError("UPDATE runtimes …", {}, ConnectionResetError("connection reset by peer"))
        return await self.real(*args, **kwargs)


async def test_a_store_error_while_applying_reports_is_retried_and_the_task_still_finishes(any_hub):
    runner = await any_hub.start_runner()
    flaky = FailingFirst(any_hub.hub.reports.apply, 2)  # fewer failures than the applier's attempts
    any_hub.hub.reports.apply = flaky
    caller = await any_hub.hub.auth.authenticate(any_hub.admin_token)
    task_id = (await any_hub.hub.tasks.submit(caller, SubmitRequest(prompt="say hi\nsay done",
                                                                    profile="scripted")))["task_id"]
    view = await any_hub.hub.tasks.wait_terminal(caller, task_id, 30)
    assert view["status"] == "succeeded" and view["result"]["text"] == "hi\ndone"
    assert flaky.calls > 2 and runner.registered.is_set()


async def test_a_store_error_that_persists_closes_the_socket_and_the_runner_reconnects_and_resends(any_hub):
    runner = await any_hub.start_runner()
    caller = await any_hub.hub.auth.authenticate(any_hub.admin_token)
    flaky = FailingFirst(any_hub.hub.reports.apply, 3)  # every attempt of one batch fails: the socket is closed
    any_hub.hub.reports.apply = flaky
    first_ws = runner.ws
    task_id = (await any_hub.hub.tasks.submit(caller, SubmitRequest(prompt="say hi\nsay done",
                                                                    profile="scripted")))["task_id"]
    view = await any_hub.hub.tasks.wait_terminal(caller, task_id, 30)
    assert view["status"] == "succeeded" and view["result"]["text"] == "hi\ndone"  # resent after reconnecting
    assert runner.ws is not first_ws and runner.registered.is_set()
    events = (await any_hub.hub.tasks.events(caller, task_id))["events"]
    assert [e["text"] for e in events if e["type"] == "text"] == ["hi", "done"]  # once each


async def test_a_store_error_during_registration_makes_the_runner_retry_not_stop(any_hub):
    any_hub.hub.registry.register = FailingFirst(any_hub.hub.registry.register, 2)
    runner = await any_hub.start_runner()  # registers on the third try
    assert runner.registered.is_set()


async def test_amux_runner_with_a_refused_token_exits_non_zero_with_one_line_naming_the_fix(hub):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hub.cli", "runner", "--hub", hub.url, "--token", "amux.nope.wrong", "--name", "x",
        cwd=REPO, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    lines = [line for line in err.decode().splitlines() if line.startswith("amux:")]
    assert proc.returncode == 3, err.decode()[-2000:]
    assert len(lines) == 1 and "amux token create" in lines[0] and "--runner" in lines[0]
    assert "Traceback" not in err.decode()


async def test_a_runner_that_is_refused_by_name_stops_and_says_why(any_hub):
    bob = await any_hub.hub.auth.create_token("bob", runner=True)
    await any_hub.start_runner(name="gpu-box")  # the admin's runner owns the name first
    from hub.runner.agent import Runner, RunnerRefused
    from hub.engines.scripted import ScriptedEngine

    squatter = Runner(any_hub.url, bob, name="gpu-box", slots=1,
                      **PROCESS_MODE, workspace_root=any_hub.hub.settings.home / "b",
                      engines={"scripted": ScriptedEngine()})
    try:
        await asyncio.wait_for(squatter.run_forever(), 20)
        raise AssertionError("the squatter kept running")
    except RunnerRefused as e:
        assert "gpu-box" in e.message


async def test_a_runtime_marked_lost_while_its_socket_is_open_is_closed_and_registers_again(any_hub):
    from tests.helpers import eventually

    runner = await any_hub.start_runner()
    caller = await any_hub.hub.auth.authenticate(any_hub.admin_token)
    first_ws, rt = runner.ws, runner.runtime_id
    async with any_hub.hub.db.write() as conn:  # what the reaper does when heartbeats went unapplied too long
        assert await any_hub.hub.dispatcher.store.mark_lost(conn, rt, any_hub.hub.clock.now() + timedelta(seconds=1))

    async def online_again() -> bool:
        async with any_hub.hub.db.read() as conn:
            row = await any_hub.hub.registry.store.find(conn, rt)
        return runner.ws is not None and runner.ws is not first_ws and row.status == "online"

    await eventually(online_again, timeout=20, interval=0.05)  # the pump closed the stale socket within a poll
    task_id = (await any_hub.hub.tasks.submit(caller, SubmitRequest(prompt="say back", profile="scripted")))["task_id"]
    view = await any_hub.hub.tasks.wait_terminal(caller, task_id, 30)
    assert view["status"] == "succeeded" and view["result"]["text"] == "back"


async def test_an_unreachable_hub_is_retried_from_0_1_s_doubling_with_jitter_and_stop_ends_it_quietly(tmp_path, caplog):
    import logging
    import socket

    from hub.engines.scripted import ScriptedEngine
    from hub.runner.agent import Runner

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    runner = Runner(f"http://127.0.0.1:{port}", "amux.x.y", name="lonely", slots=1, **PROCESS_MODE,
                    workspace_root=tmp_path / "w", engines={"scripted": ScriptedEngine()})

    def delays() -> list[float]:
        return [r.args[-1] for r in caplog.records if r.getMessage().startswith("hub unreachable")]

    with caplog.at_level(logging.INFO, logger="amux.runner"):
        task = asyncio.create_task(runner.run_forever())
        for _ in range(200):
            if len(delays()) >= 4:
                break
            await asyncio.sleep(0.05)
        await runner.stop()
        assert await asyncio.wait_for(task, 5) is None  # stopped while failing: no exception
    got = delays()[:4]
    assert len(got) == 4, got
    for d, base in zip(got, (0.1, 0.2, 0.4, 0.8)):
        assert base <= d <= base * 1.5, got


async def test_a_refusal_of_an_earlier_attempt_does_not_stop_the_attempt_the_runner_holds_now(any_hub):
    """Attempt 1's Accepted reaches the hub only after its reservation expired and attempt 2 went to the same runner:
    the hub refuses attempt 1 (drop) and confirms attempt 2 in one reply. The refusal names attempt 1, so the runner
    runs attempt 2 to its end, instead of dropping it and leaving the task `running` with nothing running it."""
    from hub.runner import protocol as p
    from tests.helpers import eventually

    runner = await any_hub.start_runner()
    caller = await any_hub.hub.auth.authenticate(any_hub.admin_token)
    real, gate, held_back = any_hub.hub.reports.apply, asyncio.Event(), asyncio.Event()

    async def late_first_accept(runtime_id, conn_id, messages):
        if any(isinstance(m, p.Accepted) and m.attempt == 1 for m in messages):
            held_back.set()
            await gate.wait()  # the runner's first Accepted is in flight past the reservation's TTL
        return await real(runtime_id, conn_id, messages)

    any_hub.hub.reports.apply = late_first_accept
    task_id = (await any_hub.hub.tasks.submit(caller, SubmitRequest(prompt="say survived",
                                                                    profile="scripted")))["task_id"]
    await asyncio.wait_for(held_back.wait(), 30)
    any_hub.clock.advance(any_hub.hub.settings.hub.reservation_ttl_s + 1)  # the reaper expires attempt 1

    async def second_attempt_on_the_runner() -> bool:
        h = runner.held.get(task_id)
        return h is not None and h.attempt == 2

    await eventually(second_attempt_on_the_runner, timeout=30, interval=0.05)
    gate.set()  # attempt 1's Accepted, then attempt 2's, reach the hub
    view = await any_hub.hub.tasks.wait_terminal(caller, task_id, 30)
    assert view["status"] == "succeeded" and view["result"]["text"] == "survived"
    async with any_hub.hub.db.read() as conn:
        attempt = (await conn.execute(sa.select(task_runs.c.attempt).where(task_runs.c.id == task_id))).scalar()
    assert attempt == 2
