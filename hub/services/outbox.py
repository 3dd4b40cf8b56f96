"""The persistent outbox: notices written with the state change that caused them, delivered by leased workers.

Stages of one round (Alertmanager notify/ shape): Claim (lease due rows, `SKIP LOCKED` on PostgreSQL) →
Gate (pure: missing admin, suspension, retired recipient, quiet hours, rate limit → digest) → Send
(through the Channel, same request uuid on every attempt) → Record (only after the call returned; a
success stores `message_id`, a failure is classified by the channel and retried, suspended or ended).
A worker that dies mid-send leaves its claim to expire; the next attempt reuses the uuid, so Feishu's
dedup turns a repeat inside its window into the same message, and past the window the notice becomes
`unconfirmed` instead of risking a duplicate.
"""
from __future__ import annotations

import asyncio
import logging
import os
import socket
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa

from ..clock import Clock, utc
from ..config import AlertSettings
from ..domain import alerts as rules
from ..ids import new_id
from ..store.db import Database
from ..store.tables import decisions, feishu_apps, incidents, outbox
from .channel import OK, PERMANENT, SUSPEND, Channel, Delivery

log = logging.getLogger(__name__)
LIVE = "pending"  # the one state a worker claims; the rest are terminal: sent|dead|unconfirmed|retired|folded|superseded


async def log_decision(conn, now: datetime, decision: str, *, detail: str | None = None, **refs: Any) -> None:  # noqa: ANN001
    """Append one decision-log row (why a notice was or was not sent)."""
    await conn.execute(decisions.insert().values(id=new_id("dec"), at=now, decision=decision,
                                                 detail=detail or rules.DECISIONS.get(decision), **refs))


async def queue_notice(conn, now: datetime, *, app_id: str, recipient: str | None, kind: str, payload: dict,  # noqa: ANN001
                       timezone: str, incident_id: str | None = None, schedule_id: str | None = None,
                       due: datetime | None = None) -> str:
    """Write one notice in the caller's transaction; its id is its stable request uuid (≤ 50 characters)."""
    nid = new_id("ntc")
    if kind == "update" and incident_id:
        # Only the newest update of a card matters: older unclaimed ones are superseded.
        await conn.execute(outbox.update().where(outbox.c.incident_id == incident_id, outbox.c.kind == "update",
                                                 outbox.c.state == LIVE, outbox.c.claimed_by.is_(None))
                           .values(state="superseded"))
    await conn.execute(outbox.insert().values(
        id=nid, app_id=app_id, recipient=recipient, kind=kind, incident_id=incident_id, schedule_id=schedule_id,
        payload=payload, request_uuid=nid, timezone=timezone, state=LIVE, attempts=0,
        next_attempt_at=due or now, created_at=now))
    return nid


def diagnostic_missing_admin(app_id: str, known: bool) -> str:
    """Say what to configure so notices for `app_id` can be delivered."""
    if not known:
        return (f"Feishu application {app_id} is not configured: add [[feishu.apps]] with app_id = \"{app_id}\" "
                "and admin_open_id to the hub's config; notices stay pending until then")
    return (f"Feishu application {app_id} has no administrator: set admin_open_id under its [[feishu.apps]] "
            "entry; notices stay pending until then")


class OutboxWorker:
    """Claim, gate, send and record notices (one per hub process; several may share one database)."""

    def __init__(self, db: Database, clock: Clock, settings: AlertSettings, numbers: rules.Numbers,
                 channel: Channel, worker_id: str | None = None) -> None:
        self.db = db
        self.clock = clock
        self.settings = settings
        self.n = numbers
        self.channel = channel
        self.worker_id = worker_id or f"{socket.gethostname()}:{os.getpid()}:{new_id('w', 4)}"
        self.sent = 0

    # ------------------------------------------------------------ claim + gate

    async def claim(self) -> list[Any]:
        """Lease due notices that pass the gate; gate the rest (defer, fold, hold, retire) in the same transaction."""
        now = self.clock.now()
        claimed: list[Any] = []
        async with self.db.read() as conn:  # most rounds find nothing: do not take the write lock for that
            if (await conn.execute(sa.select(outbox.c.id).where(outbox.c.state == LIVE, outbox.c.next_attempt_at <= now)
                                   .limit(1))).first() is None:
                return []
        async with self.db.write() as conn:
            stmt = (sa.select(outbox).where(outbox.c.state == LIVE, outbox.c.next_attempt_at <= now,
                                            sa.or_(outbox.c.claimed_until.is_(None), outbox.c.claimed_until < now))
                    .order_by(outbox.c.next_attempt_at, outbox.c.id).limit(self.settings.claim_batch))
            rows = (await conn.execute(self.db.for_update(stmt, skip_locked=True))).all()
            if not rows:
                return []
            app_ids = sorted({r.app_id for r in rows})
            # The application rows serialize rate-limit accounting between workers (locked in a fixed order).
            apps = {a.app_id: a for a in (await conn.execute(self.db.for_update(
                sa.select(feishu_apps).where(feishu_apps.c.app_id.in_(app_ids)).order_by(feishu_apps.c.app_id)))).all()}
            slots = await self._slots(conn, rows, now)
            for r in rows:
                app = apps.get(r.app_id)
                state = rules.AppState(app.admin_open_id, app.delivery_state) if app else None
                g = rules.gate(r.kind, r.recipient, r.timezone, state, slots.get((r.app_id, r.recipient or (app and app.admin_open_id)), []),
                               now, self.n)
                if g.action == "send":
                    recipient = r.recipient or app.admin_open_id
                    values = {"claimed_by": self.worker_id, "claimed_until": now + timedelta(seconds=self.settings.lease_s),
                              "recipient": recipient, "first_attempt_at": utc(r.first_attempt_at) or now}
                    if r.kind in rules.NEW_KINDS:
                        values["slot_at"] = now
                        slots.setdefault((r.app_id, recipient), []).append(now)
                    await conn.execute(outbox.update().where(outbox.c.id == r.id).values(**values))
                    claimed.append((r, values))
                else:
                    await self._gated(conn, r, g, app, now)
        return [_Claim(r, v) for r, v in claimed]

    async def _slots(self, conn, rows: list[Any], now: datetime) -> dict:  # noqa: ANN001
        since = now - timedelta(seconds=self.n.rate_window_s)
        pairs = {(r.app_id) for r in rows if r.kind in rules.NEW_KINDS}
        if not pairs:
            return {}
        got = (await conn.execute(sa.select(outbox.c.app_id, outbox.c.recipient, outbox.c.slot_at)
                                  .where(outbox.c.app_id.in_(pairs), outbox.c.slot_at > since))).all()
        out: dict = {}
        for a, rcp, at in got:
            out.setdefault((a, rcp), []).append(utc(at))
        return out

    async def _gated(self, conn, r: Any, g: rules.Gate, app: Any, now: datetime) -> None:  # noqa: ANN001
        refs = {"notice_id": r.id, "incident_id": r.incident_id, "schedule_id": r.schedule_id}
        if g.action == "defer":
            await conn.execute(outbox.update().where(outbox.c.id == r.id).values(next_attempt_at=g.until))
            await log_decision(conn, now, g.decision, detail=f"{rules.DECISIONS[g.decision]}; due {g.until.isoformat()}", **refs)
        elif g.action == "retire":
            await conn.execute(outbox.update().where(outbox.c.id == r.id).values(state="retired"))
            await log_decision(conn, now, "retired", **refs)
        elif g.action == "fold":
            digest = await self._digest_for(conn, r, r.recipient or app.admin_open_id, g.until, now)
            await conn.execute(outbox.update().where(outbox.c.id == r.id).values(state="folded", digest_id=digest))
            await log_decision(conn, now, "rate_limited", detail=f"folded into digest {digest}, due {g.until.isoformat()}", **refs)
        else:  # hold: missing administrator or suspended delivery — kept pending, never dropped
            text = rules.DECISIONS["suspended"] if g.decision == "suspended" else diagnostic_missing_admin(r.app_id, app is not None)
            if g.decision == "suspended" and app is not None and app.diagnostic:
                text = app.diagnostic
            await conn.execute(outbox.update().where(outbox.c.id == r.id).values(
                next_attempt_at=now + timedelta(seconds=self.settings.unconfigured_retry_s), last_error=text))
            if r.last_error != text:
                await log_decision(conn, now, g.decision, detail=text, **refs)
            if g.decision == "missing_admin" and app is not None and app.delivery_state != "unconfigured":
                await conn.execute(feishu_apps.update().where(feishu_apps.c.app_id == r.app_id)
                                   .values(delivery_state="unconfigured", diagnostic=text, updated_at=now))

    async def _digest_for(self, conn, r: Any, recipient: str, due: datetime, now: datetime) -> str:  # noqa: ANN001
        """Append `r` to the recipient's open digest (never attempted yet), creating it due at the next free slot."""
        item = dict(r.payload)
        row = (await conn.execute(sa.select(outbox.c.id, outbox.c.payload).where(
            outbox.c.app_id == r.app_id, outbox.c.recipient == recipient, outbox.c.kind == "digest",
            outbox.c.state == LIVE, outbox.c.first_attempt_at.is_(None)).limit(1))).first()
        if row is not None:
            payload = dict(row.payload)
            payload["items"] = list(payload.get("items", [])) + [item]
            await conn.execute(outbox.update().where(outbox.c.id == row.id).values(payload=payload))
            return row.id
        return await queue_notice(conn, now, app_id=r.app_id, recipient=recipient, kind="digest",
                                  payload={"v": 1, "kind": "digest", "app_id": r.app_id, "items": [item]},
                                  timezone=r.timezone, due=due)

    # ------------------------------------------------------------ send + record

    async def deliver_once(self) -> int:
        """Run one claim → send → record round; return how many notices were attempted."""
        claims = await self.claim()
        if not claims:
            return 0
        sem = asyncio.Semaphore(self.settings.send_concurrency)

        async def one(c: "_Claim") -> None:
            async with sem:
                try:
                    await self._deliver(c)
                except Exception:  # noqa: BLE001 — the claim expires and the notice is retried with its uuid
                    log.exception("delivering notice %s failed", c.row.id)

        await asyncio.gather(*(one(c) for c in claims))
        return len(claims)

    async def _deliver(self, c: "_Claim") -> None:
        r = c.row
        view = dict(r.payload)
        if r.kind == "update":
            await self._deliver_update(c, view)
            return
        card = None
        if r.kind == "reminder" and r.incident_id:
            card = await self._card(r.incident_id)
        if card and card[0] and rules.card_patchable(card[1], self.clock.now(), self.n):
            d = await self.channel.reply(r.app_id, card[0], view, r.request_uuid)
        else:
            d = await self.channel.send(r.app_id, c.recipient, view, r.request_uuid)
        await self._record(c, d, card_from_send=r.kind == "card")

    async def _card(self, incident_id: str) -> tuple[str | None, datetime | None] | None:
        async with self.db.read() as conn:
            row = (await conn.execute(sa.select(incidents.c.card_message_id, incidents.c.card_sent_at)
                                      .where(incidents.c.id == incident_id))).first()
            pending_card = (await conn.execute(sa.select(sa.func.count()).select_from(outbox).where(
                outbox.c.incident_id == incident_id, outbox.c.kind == "card", outbox.c.state == LIVE))).scalar()
        if row is None:
            return None
        return row.card_message_id, utc(row.card_sent_at), bool(pending_card)

    async def _deliver_update(self, c: "_Claim", view: dict) -> None:
        r = c.row
        card = await self._card(r.incident_id) if r.incident_id else None
        now = self.clock.now()
        if card is None or not card[0]:
            if card is not None and card[2]:  # its card is still on the way: wait for its message id
                await self._release(c, now + timedelta(seconds=max(1.0, self.settings.poll_s)))
                return
            await self._finish(c, "superseded", detail="the incident has no card to update (folded, retired or dead)")
            return
        if rules.card_patchable(card[1], now, self.n):
            d = await self.channel.update(r.app_id, card[0], view)
            if d.result != PERMANENT or not d.card_gone:
                await self._record(c, d, message_id=card[0])
                return
        # Older than Feishu allows, recalled or deleted: send a fresh card and record its new message id.
        d = await self.channel.send(r.app_id, c.recipient, view, r.request_uuid)
        await self._record(c, d, card_from_send=True)

    async def _release(self, c: "_Claim", when: datetime) -> None:
        async with self.db.write() as conn:
            await conn.execute(outbox.update().where(outbox.c.id == c.row.id, outbox.c.claimed_by == self.worker_id)
                               .values(claimed_by=None, claimed_until=None, next_attempt_at=when, slot_at=None))

    async def _finish(self, c: "_Claim", state: str, detail: str | None = None) -> None:
        now = self.clock.now()
        async with self.db.write() as conn:
            await conn.execute(outbox.update().where(outbox.c.id == c.row.id, outbox.c.claimed_by == self.worker_id)
                               .values(state=state, claimed_by=None, claimed_until=None))
            await log_decision(conn, now, state, detail=detail, notice_id=c.row.id, incident_id=c.row.incident_id,
                               schedule_id=c.row.schedule_id)

    async def _record(self, c: "_Claim", d: Delivery, *, card_from_send: bool = False, message_id: str | None = None) -> None:
        """Store the classified result; only a success records the message id (and the incident's card)."""
        r = c.row
        now = self.clock.now()
        refs = {"notice_id": r.id, "incident_id": r.incident_id, "schedule_id": r.schedule_id}
        attempts = r.attempts + 1
        mine = sa.and_(outbox.c.id == r.id, outbox.c.claimed_by == self.worker_id, outbox.c.state == LIVE)
        async with self.db.write() as conn:
            if d.result == OK:
                mid = d.message_id or message_id
                res = await conn.execute(outbox.update().where(mine).values(
                    state="sent", message_id=mid, sent_at=now, attempts=attempts, claimed_by=None,
                    claimed_until=None, last_error=None))
                if res.rowcount and card_from_send and r.incident_id:
                    await conn.execute(incidents.update().where(incidents.c.id == r.incident_id)
                                       .values(card_message_id=mid, card_sent_at=now, updated_at=now))
                if res.rowcount:
                    await log_decision(conn, now, "sent", detail=f"{r.kind} delivered as {mid}", **refs)
                self.sent += 1
                return
            verdict = PERMANENT if d.result == PERMANENT else (SUSPEND if d.result == SUSPEND else "retry")
            state, nxt, decision = rules.after_failure(verdict, attempts, c.values["first_attempt_at"], now,
                                                       d.retry_after_s, self.n)
            error = f"{d.code}: {d.error}" if d.code is not None else (d.error or d.result)
            values: dict[str, Any] = {"state": state, "attempts": attempts, "claimed_by": None, "claimed_until": None,
                                      "last_error": error[:2000]}
            if nxt is not None:
                values["next_attempt_at"] = nxt
            if verdict == SUSPEND:
                # Not delivered at all: the next attempt (after recheck) starts a fresh dedup window and slot.
                values.update(first_attempt_at=None, slot_at=None,
                              next_attempt_at=now + timedelta(seconds=self.settings.unconfigured_retry_s))
            res = await conn.execute(outbox.update().where(mine).values(**values))
            if not res.rowcount:
                return
            if verdict == SUSPEND:
                text = (f"delivery to the administrator of {r.app_id} is suspended ({error}); fix the bot's "
                        f"availability or the block, then run `amux feishu recheck --app {r.app_id}`")
                await conn.execute(feishu_apps.update().where(feishu_apps.c.app_id == r.app_id)
                                   .values(delivery_state="suspended", diagnostic=text, updated_at=now))
                await log_decision(conn, now, "suspended", detail=text, **refs)
            else:
                await log_decision(conn, now, decision, detail=f"{rules.DECISIONS[decision]} ({error})", **refs)


class _Claim:
    """A leased notice and the values the claim wrote."""

    def __init__(self, row: Any, values: dict) -> None:
        self.row = row
        self.values = values
        self.recipient = values["recipient"]
