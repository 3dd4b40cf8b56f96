"""Placement hands its dispatches to the runner connections of its own replica in its own transaction (no pump round
between a submission and its runner), and a kick with nothing queued opens no write transaction."""
from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from hub.services.admission import SubmitRequest
from hub.store.tables import reservations
from tests.helpers import eventually, start_hub


@pytest.fixture
async def quiet_hub(db_url: str, tmp_path: Path, clock):  # noqa: ANN001
    """A hub without its loops, whose runner pump polls once an hour: only a wake-up runs a pump round."""
    handle = await start_hub(db_url, tmp_path, clock, background=False, poll_s=3600.0)
    yield handle
    await handle.stop()


def count_calls(obj: object, name: str) -> list[int]:
    """Wrap `obj.name` (an async method) to count its calls; return the one-item counter."""
    calls = [0]
    inner = getattr(obj, name)

    async def counted(*args, **kw):  # noqa: ANN002, ANN003, ANN202
        calls[0] += 1
        return await inner(*args, **kw)

    setattr(obj, name, counted)
    return calls


async def test_placement_sends_this_replicas_dispatches_from_its_own_transaction_without_a_pump_round(quiet_hub):
    hub = quiet_hub
    rounds = count_calls(hub.hub.runtimes, "outgoing_many")
    await hub.start_runner(slots=2)

    async def registration_round_ran() -> bool:  # the round registration wakes (what was held, sent again)
        return rounds[0] >= 1

    await eventually(registration_round_ran)
    before = rounds[0]
    alice = await hub.hub.auth.authenticate(await hub.token("alice"))
    task_id = (await hub.hub.tasks.submit(alice, SubmitRequest(prompt="say hi", profile="scripted")))["task_id"]

    assert await hub.hub.dispatcher.place_once() == 1
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
