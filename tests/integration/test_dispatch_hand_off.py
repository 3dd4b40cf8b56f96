"""Placement hands its dispatches to the runner connections of its own replica in its own transaction (no pump round
between a submission and its runner); a placement kick with nothing queued, and a pump round with nothing to claim,
open no write transaction, and the pump still sends cancels and closes revoked connections; a batch of runner reports
reads its runs in one statement and inserts its events in one."""
from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Iterator

import pytest
import sqlalchemy as sa
from sqlalchemy import event

from hub.runner import protocol as p
from hub.services.tasks.admission import SubmitRequest
from hub.services.tasks.dispatch import Link
from hub.store.tables import api_tokens, reservations
from tests.helpers import eventually, start_hub


@pytest.fixture
async def quiet_hub(db_url: str, tmp_path: Path, clock):
    """A hub without its loops, whose runner pump polls once an hour: only a wake-up runs a pump round."""
    handle = await start_hub(db_url, tmp_path, clock, background=False, poll_s=3600.0)
    yield handle
    await handle.stop()


async def three_queued(hub):
    """Start a runner with three slots; return alice (a Caller) and three `sleep 30` tasks of hers, queued."""
    await hub.start_runner(slots=3)
    alice = await hub.hub.auth.authenticate(await hub.token("alice"))
    ids = [(await hub.hub.tasks.submit(alice, SubmitRequest(prompt="sleep 30", profile="scripted")))["task_id"]
           for _ in range(3)]
    return alice, ids


@contextlib.contextmanager
def statements_run(hub) -> Iterator[list[str]]:
    """Collect the SQL of every statement the hub's engine runs inside the block."""
    statements: list[str] = []

    def seen(_c, _cur, statement, *_rest) -> None:
        statements.append(statement)

    event.listen(hub.hub.db.sync_engine, "before_cursor_execute", seen)
    try:
        yield statements
    finally:
        event.remove(hub.hub.db.sync_engine, "before_cursor_execute", seen)


def count_calls(obj: object, name: str) -> list[int]:
    """Wrap `obj.name` (an async method) to count its calls; return the one-item counter."""
    calls = [0]
    inner = getattr(obj, name)

    async def counted(*args, **kw):
        calls[0] += 1
        return await inner(*args, **kw)

    setattr(obj, name, counted)
    return calls


async def test_a_reaper_round_with_nothing_to_reap_opens_no_write_transaction_and_an_overdue_run_is_still_reaped(
        quiet_hub):
    hub = quiet_hub
    await hub.start_runner(slots=2)
    alice = await hub.hub.auth.authenticate(await hub.token("alice"))
    task_id = (await hub.hub.tasks.submit(alice, SubmitRequest(prompt="sleep 30", profile="scripted",
                                                               timeout_s=60)))["task_id"]
    assert await hub.hub.dispatcher.place_once() == 1

    async def running() -> bool:  # accepted: its reservation is committed, so only its deadline can end it
        return (await hub.hub.tasks.get(alice, task_id))["status"] == "running"

    await eventually(running)
    writes = count_calls(hub.hub.db, "transaction")

    assert sum((await hub.hub.dispatcher.reap_once()).values()) == 0

    assert writes[0] == 0
    hub.hub.settings.hub.runtime_lost_s = 10 ** 6  # its heartbeats are stamped with the clock this test moves
    hub.clock.advance(60 + hub.hub.settings.hub.deadline_grace_s + 1)
    assert (await hub.hub.dispatcher.reap_once())["timed_out"] == 1
    assert (await hub.hub.tasks.get(alice, task_id))["status"] == "timed_out"


async def test_placement_sends_this_replicas_dispatches_from_its_own_transaction_without_a_pump_round(quiet_hub):
    hub = quiet_hub
    rounds = count_calls(hub.hub.runner_dispatch, "outgoing_many")
    await hub.start_runner(slots=2)

    async def registration_round_ran() -> bool:  # the round registration wakes (what was held, sent again)
        return rounds[0] >= 1

    await eventually(registration_round_ran)
    before = rounds[0]
    alice = await hub.hub.auth.authenticate(await hub.token("alice"))
    task_id = (await hub.hub.tasks.submit(alice, SubmitRequest(prompt="say hi", profile="scripted")))["task_id"]

    with statements_run(hub) as statements:
        assert await hub.hub.dispatcher.place_once() == 1
    # A fresh first attempt has no earlier run token: its dispatch revokes none (a resent one does: test_token_kinds)
    assert not [s for s in statements if s.lstrip().upper().startswith("UPDATE API_TOKENS")]
    async with hub.hub.db.read() as conn:  # committed with the reservation: claimed as sent by placement itself
        sent_at = (await conn.execute(sa.select(reservations.c.sent_at)
                                      .where(reservations.c.task_id == task_id))).scalar_one()
    assert sent_at is not None
    done = await hub.hub.tasks.wait_terminal(alice, task_id, timeout_s=20)

    assert done["status"] == "succeeded"
    assert rounds[0] == before  # the runner got it with no pump round


async def test_a_placement_kick_with_nothing_queued_opens_no_write_transaction(quiet_hub):
    hub = quiet_hub
    await hub.start_runner(slots=2)
    writes = count_calls(hub.hub.db, "transaction")

    assert await hub.hub.dispatcher.place_once() == 0

    assert writes[0] == 0
    alice = await hub.hub.auth.authenticate(await hub.token("alice"))
    task_id = (await hub.hub.tasks.submit(alice, SubmitRequest(prompt="say hi", profile="scripted")))["task_id"]
    assert await hub.hub.dispatcher.place_once() == 1  # a queued task: placed as before
    assert (await hub.hub.tasks.wait_terminal(alice, task_id, timeout_s=20))["status"] == "succeeded"


async def test_a_pump_round_with_nothing_to_claim_takes_no_write_lock_yet_sends_a_cancel_and_sees_a_revocation(
        quiet_hub):
    hub = quiet_hub
    await hub.start_runner(slots=2)
    alice = await hub.hub.auth.authenticate(await hub.token("alice"))
    task_id = (await hub.hub.tasks.submit(alice, SubmitRequest(prompt="sleep 30\nsay done",
                                                               profile="scripted")))["task_id"]
    assert await hub.hub.dispatcher.place_once() == 1

    async def running() -> bool:
        return (await hub.hub.tasks.get(alice, task_id))["status"] == "running"

    await eventually(running)
    async with hub.hub.db.write() as conn:  # asked for directly: the endpoint's wake-up is not what is tested
        await conn.execute(sa.text("UPDATE task_runs SET cancel_requested_at = CURRENT_TIMESTAMP WHERE id = :id"),
                           {"id": task_id})
    (sock,) = hub.hub.runner_endpoint.sockets.values()
    link = Link(runtime_id=sock.link.runtime_id, conn_id=sock.link.conn_id, token_id=sock.link.token_id)
    writes = count_calls(hub.hub.db, "transaction")

    due = await hub.hub.runner_dispatch.outgoing_many([link])
    again = await hub.hub.runner_dispatch.outgoing_many([link])

    assert due.messages == {link.conn_id: [p.Cancel(task_id=task_id, attempt=1).model_dump()]} and not due.revoked
    assert again.messages == {}  # a cancel goes once per connection
    async with hub.hub.db.write() as conn:  # revoked behind the endpoint's back, as on another replica
        await conn.execute(api_tokens.update().where(api_tokens.c.id == link.token_id)
                           .values(revoked_at=hub.hub.clock.now()))
    assert (await hub.hub.runner_dispatch.outgoing_many([link])).revoked == {link.conn_id}
    assert writes[0] == 0


async def test_a_batch_of_reports_on_several_runs_reads_them_in_one_statement_and_inserts_their_events_in_one(
        quiet_hub):
    """...and releases the reservations and revokes the run tokens of the runs it ends in one statement each."""
    hub = quiet_hub
    alice, ids = await three_queued(hub)
    assert await hub.hub.dispatcher.place_once() == 3

    async def all_running() -> bool:
        return all([(await hub.hub.tasks.get(alice, t))["status"] == "running" for t in ids])

    await eventually(all_running)
    (sock,) = hub.hub.runner_endpoint.sockets.values()
    batch = [m for t in ids for m in (
        p.Events(task_id=t, attempt=1, events=[p.Event(rseq=1, type="text", payload={"text": f"hello {t}"})]),
        p.Finished(task_id=t, attempt=1, rseq=2, outcome="succeeded", result_text="done"))]
    with statements_run(hub) as statements:
        replies = await hub.hub.reports.apply(sock.link.runtime_id, sock.link.conn_id, batch)

    assert [r["drop"] for r in replies if r["type"] == "ack"] == [False] * 6
    assert sum(s.lstrip().upper().startswith("SELECT") and "task_runs" in s for s in statements) == 1
    assert sum(s.lstrip().upper().startswith("INSERT INTO TASK_EVENTS") for s in statements) == 1
    assert sum(s.lstrip().upper().startswith("UPDATE RESERVATIONS") for s in statements) == 1
    assert sum(s.lstrip().upper().startswith("UPDATE API_TOKENS") for s in statements) == 1
    async with hub.hub.db.read() as conn:
        states = (await conn.execute(sa.select(reservations.c.state).where(reservations.c.task_id.in_(ids)))).scalars()
        live = (await conn.execute(sa.select(api_tokens.c.id).where(api_tokens.c.task_id.in_(ids),
                                                                    api_tokens.c.revoked_at.is_(None)))).all()
    assert list(states) == ["released"] * 3 and live == []
    for t in ids:
        view = await hub.hub.tasks.get(alice, t)
        texts = [e["text"] for e in (await hub.hub.tasks.events(alice, t))["events"] if e["type"] == "text"]
        assert (view["status"], view["result"]["text"], texts) == ("succeeded", "done", [f"hello {t}"])


async def test_a_placement_round_mints_its_runs_tokens_with_one_insert_and_each_run_gets_its_own_run_token(
        quiet_hub):
    hub = quiet_hub
    alice, ids = await three_queued(hub)
    with statements_run(hub) as statements:
        assert await hub.hub.dispatcher.place_once() == 3

    assert sum(s.lstrip().upper().startswith("INSERT INTO API_TOKENS") for s in statements) == 1
    assert not any(s.lstrip().upper().startswith("UPDATE API_TOKENS") for s in statements)  # first attempts
    async with hub.hub.db.read() as conn:
        rows = (await conn.execute(sa.select(api_tokens.c.task_id, api_tokens.c.label, api_tokens.c.kind)
                                   .where(api_tokens.c.task_id.in_(ids)))).all()
    assert sorted(rows) == sorted((t, f"run:{t}", "run") for t in ids)
