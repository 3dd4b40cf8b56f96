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

from ..clock import Clock, utc
from ..config import AlertSettings
from ..domain import alerts as rules
from ..domain.states import DeliveryState, NoticeState
from ..ids import new_id
from ..store.db import Connection, Database, Row
from ..store.incidents import LIVE, SqlIncidentStore, SqlOutboxStore
from .channel import OK, PERMANENT, SUSPEND, Channel, Delivery

log = logging.getLogger(__name__)
__all__ = ["LIVE", "Notices", "OutboxWorker", "diagnostic_missing_admin"]


class Notices:
    """Write notices and decision-log rows in the caller's transaction (the alert service and the worker share it)."""

    def __init__(self, db: Database) -> None:
        self.outbox = SqlOutboxStore(db)
        self.incidents = SqlIncidentStore(db)

    async def log(self, conn: Connection, now: datetime, decision: str, *, detail: str | None = None,
                  **refs: Any) -> None:
        """Append one decision-log row (why a notice was or was not sent)."""
        await self.incidents.log(conn, decision_id=new_id("dec"), at=now, decision=decision,
                                 detail=detail or rules.DECISIONS.get(decision), **refs)

    async def queue(self, conn: Connection, now: datetime, *, app_id: str, recipient: str | None, kind: str,
                    payload: dict, timezone: str, incident_id: str | None = None, schedule_id: str | None = None,
                    due: datetime | None = None) -> str:
        """Write one notice in the caller's transaction; its id is its stable request uuid (≤ 50 characters)."""
        nid = new_id("ntc")
        if kind == "update" and incident_id:
            await self.outbox.supersede_updates(conn, incident_id)  # only the newest update of a card matters
        await self.outbox.add(conn, notice_id=nid, app_id=app_id, recipient=recipient, kind=kind, payload=payload,
                              timezone=timezone, incident_id=incident_id, schedule_id=schedule_id, due=due or now,
                              now=now)
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
        self.notices = Notices(db)
        self.outbox = self.notices.outbox
        self.incidents = self.notices.incidents
        self.sent = 0

    # ------------------------------------------------------------ claim + gate

    async def claim(self) -> list["_Claim"]:
        """Lease due notices that pass the gate; gate the rest (defer, fold, hold, retire) in the same transaction."""
        now = self.clock.now()
        claimed: list[_Claim] = []
        async with self.db.read() as conn:  # most rounds find nothing: do not take the write lock for that
            if not await self.outbox.any_due(conn, now):
                return []
        async with self.db.write() as conn:
            rows = await self.outbox.lock_due(conn, now, self.settings.claim_batch)
            if not rows:
                return []
            apps = await self.incidents.lock_apps(conn, {r.app_id for r in rows})
            slots = await self._slots(conn, rows, now)
            for r in rows:
                app = apps.get(r.app_id)
                state = rules.AppState(app.admin_open_id, app.delivery_state) if app else None
                g = rules.gate(r.kind, r.recipient, r.timezone, state,
                               slots.get((r.app_id, r.recipient or (app and app.admin_open_id)), []), now, self.n)
                if g.action == "send":
                    recipient = r.recipient or app.admin_open_id
                    values = {"claimed_by": self.worker_id,
                              "claimed_until": now + timedelta(seconds=self.settings.lease_s), "recipient": recipient,
                              "first_attempt_at": utc(r.first_attempt_at) or now}
                    slot = None
                    if r.kind in rules.NEW_KINDS:
                        values["slot_at"] = slot = now
                        slots.setdefault((r.app_id, recipient), []).append(now)
                    await self.outbox.claim(conn, r.id, worker=self.worker_id, until=values["claimed_until"],
                                            recipient=recipient, first_attempt_at=values["first_attempt_at"],
                                            slot_at=slot)
                    claimed.append(_Claim(r, values))
                else:
                    await self._gated(conn, r, g, app, now)
        return claimed

    async def _slots(self, conn: Connection, rows: list[Row], now: datetime) -> dict:
        since = now - timedelta(seconds=self.n.rate_window_s)
        app_ids = {r.app_id for r in rows if r.kind in rules.NEW_KINDS}
        if not app_ids:
            return {}
        out: dict = {}
        for a, rcp, at in await self.outbox.slots_since(conn, app_ids, since):
            out.setdefault((a, rcp), []).append(utc(at))
        return out

    async def _gated(self, conn: Connection, r: Row, g: rules.Gate, app: Row | None, now: datetime) -> None:
        refs = {"notice_id": r.id, "incident_id": r.incident_id, "schedule_id": r.schedule_id}
        if g.action == "defer":
            await self.outbox.defer(conn, r.id, g.until)
            await self.notices.log(conn, now, g.decision,
                                   detail=f"{rules.DECISIONS[g.decision]}; due {g.until.isoformat()}", **refs)
        elif g.action == "retire":
            await self.outbox.retire(conn, r.id)
            await self.notices.log(conn, now, "retired", **refs)
        elif g.action == "fold":
            digest = await self._digest_for(conn, r, r.recipient or app.admin_open_id, g.until, now)
            await self.outbox.fold(conn, r.id, digest)
            await self.notices.log(conn, now, "rate_limited",
                                   detail=f"folded into digest {digest}, due {g.until.isoformat()}", **refs)
        else:  # hold: missing administrator or suspended delivery — kept pending, never dropped
            text = (rules.DECISIONS["suspended"] if g.decision == "suspended"
                    else diagnostic_missing_admin(r.app_id, app is not None))
            if g.decision == "suspended" and app is not None and app.diagnostic:
                text = app.diagnostic
            await self.outbox.hold(conn, r.id, now + timedelta(seconds=self.settings.unconfigured_retry_s), text)
            if r.last_error != text:
                await self.notices.log(conn, now, g.decision, detail=text, **refs)
            if g.decision == "missing_admin" and app is not None and app.delivery_state != DeliveryState.UNCONFIGURED:
                await self.incidents.set_delivery(conn, r.app_id, DeliveryState.UNCONFIGURED, text, now)

    async def _digest_for(self, conn: Connection, r: Row, recipient: str, due: datetime, now: datetime) -> str:
        """Append `r` to the recipient's open digest (never attempted yet), creating it due at the next free slot."""
        item = dict(r.payload)
        row = await self.outbox.open_digest(conn, r.app_id, recipient)
        if row is not None:
            payload = dict(row.payload)
            payload["items"] = list(payload.get("items", [])) + [item]
            await self.outbox.set_payload(conn, row.id, payload)
            return row.id
        return await self.notices.queue(conn, now, app_id=r.app_id, recipient=recipient, kind="digest",
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

    async def _card(self, incident_id: str) -> tuple[str | None, datetime | None, bool] | None:
        async with self.db.read() as conn:
            row = await self.incidents.card(conn, incident_id)
            pending_card = await self.outbox.card_pending(conn, incident_id)
        if row is None:
            return None
        return row.card_message_id, utc(row.card_sent_at), pending_card

    async def _deliver_update(self, c: "_Claim", view: dict) -> None:
        r = c.row
        card = await self._card(r.incident_id) if r.incident_id else None
        now = self.clock.now()
        if card is None or not card[0]:
            if card is not None and card[2]:  # its card is still on the way: wait for its message id
                await self._release(c, now + timedelta(seconds=max(1.0, self.settings.poll_s)))
                return
            await self._finish(c, NoticeState.SUPERSEDED,
                               detail="the incident has no card to update (folded, retired or dead)")
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
            await self.outbox.release(conn, c.row.id, self.worker_id, when)

    async def _finish(self, c: "_Claim", state: str, detail: str | None = None) -> None:
        now = self.clock.now()
        async with self.db.write() as conn:
            await self.outbox.finish(conn, c.row.id, self.worker_id, state)
            await self.notices.log(conn, now, state, detail=detail, notice_id=c.row.id, incident_id=c.row.incident_id,
                                   schedule_id=c.row.schedule_id)

    async def _record(self, c: "_Claim", d: Delivery, *, card_from_send: bool = False,
                      message_id: str | None = None) -> None:
        """Store the classified result; only a success records the message id (and the incident's card)."""
        r = c.row
        now = self.clock.now()
        refs = {"notice_id": r.id, "incident_id": r.incident_id, "schedule_id": r.schedule_id}
        attempts = r.attempts + 1
        async with self.db.write() as conn:
            if d.result == OK:
                mid = d.message_id or message_id
                recorded = await self.outbox.record_sent(conn, r.id, self.worker_id, message_id=mid,
                                                         attempts=attempts, now=now)
                if recorded and card_from_send and r.incident_id:
                    await self.incidents.set_card(conn, r.incident_id, mid, now)
                if recorded:
                    await self.notices.log(conn, now, "sent", detail=f"{r.kind} delivered as {mid}", **refs)
                self.sent += 1
                return
            verdict = PERMANENT if d.result == PERMANENT else (SUSPEND if d.result == SUSPEND else "retry")
            state, nxt, decision = rules.after_failure(verdict, attempts, c.values["first_attempt_at"], now,
                                                       d.retry_after_s, self.n)
            error = f"{d.code}: {d.error}" if d.code is not None else (d.error or d.result)
            if verdict == SUSPEND:
                # Not delivered at all: the next attempt (after recheck) starts a fresh dedup window and slot.
                nxt = now + timedelta(seconds=self.settings.unconfigured_retry_s)
            if not await self.outbox.record_failure(conn, r.id, self.worker_id, state=state, attempts=attempts,
                                                    error=error, next_attempt_at=nxt, new_window=verdict == SUSPEND):
                return
            if verdict == SUSPEND:
                text = (f"delivery to the administrator of {r.app_id} is suspended ({error}); fix the bot's "
                        f"availability or the block, then run `amux feishu recheck --app {r.app_id}`")
                await self.incidents.set_delivery(conn, r.app_id, DeliveryState.SUSPENDED, text, now)
                await self.notices.log(conn, now, "suspended", detail=text, **refs)
            else:
                await self.notices.log(conn, now, decision, detail=f"{rules.DECISIONS[decision]} ({error})", **refs)


class _Claim:
    """A leased notice and the values the claim wrote."""

    def __init__(self, row: Row, values: dict) -> None:
        self.row = row
        self.values = values
        self.recipient = values["recipient"]
