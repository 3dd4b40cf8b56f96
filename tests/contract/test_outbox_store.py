"""Outbox store contract on SQLite and PostgreSQL: claims, leases, and no double send across two workers."""
from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

import sqlalchemy as sa

from hub.clock import ManualClock
from hub.config import AlertSettings
from hub.domain.alerts import Numbers
from hub.services.alerts.channel import OK, Delivery
from hub.services.alerts.outbox import Notices, OutboxWorker, _Result
from hub.store.tables import decisions, feishu_apps, outbox

APP = "cli_contract"


class CountingChannel:
    """Record every send; answer ok after a short real delay (so two workers overlap)."""

    def __init__(self) -> None:
        self.sends: list[str] = []

    async def send(self, app_id: str, recipient: str, view: dict[str, Any], request_uuid: str) -> Delivery:
        self.sends.append(request_uuid)
        await asyncio.sleep(0.01)
        return Delivery(OK, message_id=f"om_{request_uuid}")

    async def reply(self, app_id, message_id, view, request_uuid):
        return await self.send(app_id, "", view, request_uuid)

    async def update(self, app_id, message_id, view):
        return Delivery(OK)

    async def aclose(self) -> None:
        pass


async def _seed(db, clock: ManualClock, count: int, kind: str = "update") -> None:
    async with db.write() as conn:
        await conn.execute(feishu_apps.insert().values(app_id=APP, admin_open_id="ou_admin", admin_epoch=0,
                                                       delivery_state="ok", timezone="UTC", updated_at=clock.now()))
        for i in range(count):
            await Notices(db).queue(conn, clock.now(), app_id=APP, recipient="ou_admin", kind=kind,
                               payload={"v": 1, "kind": "receipt", "i": i}, timezone="UTC")


def _worker(db, clock, channel, name: str, **kw) -> OutboxWorker:
    s = AlertSettings(claim_batch=7, quiet_hours="", max_new_messages=10_000, **kw)
    return OutboxWorker(db, clock, s, Numbers.of(s, 3600), channel, worker_id=name)


async def test_two_workers_never_send_the_same_notice_twice(db, clock):
    await _seed(db, clock, 60, kind="receipt")
    ch = CountingChannel()
    a, b = _worker(db, clock, ch, "a"), _worker(db, clock, ch, "b")
    for _ in range(20):
        await asyncio.gather(a.deliver_once(), b.deliver_once())
    assert len(ch.sends) == 60 and len(set(ch.sends)) == 60
    async with db.read() as conn:
        states = (await conn.execute(sa.select(outbox.c.state, sa.func.count()).group_by(outbox.c.state))).all()
    assert dict(states) == {"sent": 60}


async def test_a_claim_is_leased_and_expires_for_another_worker(db, clock):
    await _seed(db, clock, 1, kind="receipt")
    ch = CountingChannel()
    a, b = _worker(db, clock, ch, "a", lease_s=30), _worker(db, clock, ch, "b", lease_s=30)
    claims = await a.claim()                       # worker a dies right after claiming
    assert len(claims) == 1
    assert await b.claim() == []                   # leased: b cannot take it
    clock.advance(31)
    again = await b.claim()                        # the lease expired: b takes it, same request uuid
    assert [c.row.request_uuid for c in again] == [claims[0].row.request_uuid]


async def test_a_late_result_from_an_expired_claim_is_not_recorded_over_the_new_owner(db, clock):
    await _seed(db, clock, 1, kind="receipt")
    ch = CountingChannel()
    a, b = _worker(db, clock, ch, "a", lease_s=30), _worker(db, clock, ch, "b", lease_s=30)
    (ca,) = await a.claim()
    clock.advance(31)
    (cb,) = await b.claim()
    await a._record(ca, Delivery("retry", error="late"))   # a's answer arrives after its lease
    async with db.read() as conn:
        row = (await conn.execute(sa.select(outbox))).first()
    assert row.claimed_by == "b" and row.attempts == 0
    await b._record(cb, Delivery(OK, message_id="om_1"))
    async with db.read() as conn:
        row = (await conn.execute(sa.select(outbox))).first()
    assert row.state == "sent" and row.message_id == "om_1"


async def test_due_time_orders_claims_and_future_notices_wait(db, clock):
    await _seed(db, clock, 0)
    async with db.write() as conn:
        await Notices(db).queue(conn, clock.now(), app_id=APP, recipient="ou_admin", kind="receipt", payload={},
                                timezone="UTC", due=clock.now() + timedelta(seconds=60))
    w = _worker(db, clock, CountingChannel(), "a")
    assert await w.claim() == []
    clock.advance(60)
    assert len(await w.claim()) == 1


async def test_a_round_records_every_result_and_a_late_one_from_an_expired_claim_changes_nothing(db, clock):
    await _seed(db, clock, 3, kind="receipt")
    ch = CountingChannel()
    a, b = _worker(db, clock, ch, "a", lease_s=30), _worker(db, clock, ch, "b", lease_s=30)
    c1, c2, c3 = await a.claim()
    clock.advance(31)
    async with db.write() as conn:  # c3's claim expired and b took it over; c1 and c2 are still a's
        await conn.execute(outbox.update().where(outbox.c.id.in_([c1.row.id, c2.row.id]))
                           .values(claimed_until=clock.now() + timedelta(seconds=30)))
    (cb,) = await b.claim()
    assert cb.row.id == c3.row.id
    await a._record_round([  # one round: a success, a retry, and a late success over b's claim
        _Result(c1, Delivery(OK, message_id="om_1")), _Result(c2, Delivery("retry", error="busy")),
        _Result(c3, Delivery(OK, message_id="om_late"))])
    async with db.read() as conn:
        rows = {r.id: r for r in (await conn.execute(sa.select(outbox))).all()}
        logged = (await conn.execute(sa.select(decisions.c.notice_id, decisions.c.decision))).all()
    assert (rows[c1.row.id].state, rows[c1.row.id].message_id, rows[c1.row.id].attempts) == ("sent", "om_1", 1)
    assert (rows[c2.row.id].state, rows[c2.row.id].claimed_by, rows[c2.row.id].attempts) == ("pending", None, 1)
    assert (rows[c3.row.id].state, rows[c3.row.id].claimed_by, rows[c3.row.id].message_id) == ("pending", "b", None)
    assert sorted(n for n, d in logged if d == "sent") == [c1.row.id]
    assert c3.row.id not in {n for n, _ in logged}


async def test_full_rounds_are_claimed_while_the_previous_one_sends_and_all_are_recorded_before_it_returns(db, clock):
    await _seed(db, clock, 30, kind="receipt")
    ch = CountingChannel()
    w = _worker(db, clock, ch, "a")
    assert await w.deliver_once() == 30            # 5 rounds of ≤ 7: full ones are followed by the next claim
    assert len(ch.sends) == 30 and len(set(ch.sends)) == 30
    async with db.read() as conn:
        states = dict((await conn.execute(sa.select(outbox.c.state, sa.func.count()).group_by(outbox.c.state))).all())
        sent = (await conn.execute(sa.select(sa.func.count()).select_from(decisions)
                                   .where(decisions.c.decision == "sent"))).scalar()
    assert states == {"sent": 30} and sent == 30
    assert await w.deliver_once() == 0
