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
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from ...clock import Clock, utc
from ...config import AlertSettings
from ...domain import alerts as rules
from ...domain.states import DeliveryState, NoticeState
from ...ids import new_id
from ...loops import Background
from ...store.db import Connection, Database, Row
from ...store.chat_turns import SqlChatTurnStore
from ...store.incidents import NewDecision, SqlIncidentStore
from ...store.outbox import LIVE, NoticeClaim, NoticeSent, SqlOutboxStore
from .channel import OK, PERMANENT, SUSPEND, Channel, Delivery

log = logging.getLogger(__name__)
CHAT_WAIT_S = 0.2     # a card update waits this long for its card's message id, or for an earlier update
PIPELINED_ROUNDS = 8  # rounds one `deliver_once` runs back to back while full ones keep coming
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
                    due: datetime | None = None, turn_id: str | None = None) -> str:
        """Write one notice in the caller's transaction; its id is its stable request uuid (≤ 50 characters)."""
        nid = new_id("ntc")
        if kind == "update" and incident_id:
            await self.outbox.supersede_updates(conn, incident_id)  # only the newest update of a card matters
        await self.outbox.add(conn, notice_id=nid, app_id=app_id, recipient=recipient, kind=kind, payload=payload,
                              timezone=timezone, incident_id=incident_id, schedule_id=schedule_id, due=due or now,
                              now=now, turn_id=turn_id)
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
        self.chats = SqlChatTurnStore(db)
        self.sent = 0
        self._rounds = Background("outbox rounds")  # the round in flight while the next one is claimed

    # ------------------------------------------------------------ claim + gate

    async def claim(self) -> list["_Claim"]:
        """Lease due notices that pass the gate; gate the rest (defer, fold, hold, retire) in the same transaction."""
        now = self.clock.now()
        async with self.db.read() as conn:  # most rounds find nothing: do not take the write lock for that
            if not await self.outbox.any_due(conn, now):
                return []
        return await self.db.transaction(lambda conn: self._claim(conn, now))

    async def _claim(self, conn: Connection, now: datetime) -> list["_Claim"]:
        """`claim`'s transaction."""
        claimed: list[_Claim] = []
        rows = await self.outbox.lock_due(conn, now, self.settings.claim_batch)
        if not rows:
            return []
        apps = await self.incidents.lock_apps(conn, {r.app_id for r in rows})
        slots = await self._slots(conn, rows, now)
        until = now + timedelta(seconds=self.settings.lease_s)
        leases: list[NoticeClaim] = []
        gated: list[tuple[Row, rules.Gate, Row | None]] = []
        for r in rows:
            app = apps.get(r.app_id)
            state = rules.AppState(app.admin_open_id, app.delivery_state) if app else None
            # A retry's own earlier slot is not counted against it: it retakes that slot, it takes no new one.
            taken = slots.get((r.app_id, r.recipient or (app.admin_open_id if app else None)), {})
            g = rules.gate(r.kind, r.recipient, r.timezone, state,
                           [at for nid, at in taken.items() if nid != r.id], now, self.n)
            if g.action != "send" or app is None:  # the gate sends only to a configured administrator
                gated.append((r, g, app))
                continue
            recipient = r.recipient or app.admin_open_id
            values = {"claimed_by": self.worker_id, "claimed_until": until, "recipient": recipient,
                      "first_attempt_at": utc(r.first_attempt_at) or now}
            slot = None
            if r.kind in rules.NEW_KINDS:
                values["slot_at"] = slot = now
                slots.setdefault((r.app_id, recipient), {})[r.id] = now
            leases.append(NoticeClaim(notice_id=r.id, recipient=recipient,
                                      first_attempt_at=values["first_attempt_at"], slot_at=slot))
            claimed.append(_Claim(r, values))
        # Claimed before the gated rows are handled, so a digest leased in this round takes no folded item.
        await self.outbox.claim_many(conn, leases, worker=self.worker_id, until=until)
        for r, g, app in gated:
            await self._gated(conn, r, g, app, now)
        return claimed

    async def _slots(self, conn: Connection, rows: list[Row],
                     now: datetime) -> dict[tuple[str, str | None], dict[str, datetime]]:
        """Map (application, recipient) to the notices holding a new-message slot in the window, and when."""
        since = now - timedelta(seconds=self.n.rate_window_s)
        app_ids = {r.app_id for r in rows if r.kind in rules.NEW_KINDS}
        if not app_ids:
            return {}
        out: dict[tuple[str, str | None], dict[str, datetime]] = {}
        for a, rcp, nid, at in await self.outbox.slots_since(conn, app_ids, since):
            out.setdefault((a, rcp), {})[nid] = utc(at) or at
        return out

    async def _gated(self, conn: Connection, r: Row, g: rules.Gate, app: Row | None, now: datetime) -> None:
        refs = {"notice_id": r.id, "incident_id": r.incident_id, "schedule_id": r.schedule_id}
        if g.action == "defer" and g.until is not None:
            await self.outbox.defer(conn, r.id, g.until)
            await self.notices.log(conn, now, g.decision,
                                   detail=f"{rules.DECISIONS[g.decision]}; due {g.until.isoformat()}", **refs)
        elif g.action == "retire":
            await self.outbox.retire(conn, r.id)
            await self.notices.log(conn, now, "retired", **refs)
        elif g.action == "fold" and g.until is not None and app is not None:
            digest = await self._digest_for(conn, r, r.recipient or app.admin_open_id, g.until, now)
            await self.outbox.fold(conn, r.id, digest)
            await self.notices.log(conn, now, "rate_limited",
                                   detail=f"folded into digest {digest}, due {g.until.isoformat()}", **refs)
        else:  # hold: missing administrator or suspended delivery (or a verdict short of what it needs) — kept
            # pending, never dropped
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
        """Run claim → send → record rounds; return how many notices were attempted. While a full round sends,
        the next one is claimed (two rounds in flight, up to `PIPELINED_ROUNDS`); every round started is recorded
        before this returns."""
        claims, attempted, rounds = await self.claim(), 0, 0
        while claims:
            attempted, rounds = attempted + len(claims), rounds + 1
            inflight = self._rounds.spawn(self._send_round(claims))
            more = len(claims) >= self.settings.claim_batch and rounds < PIPELINED_ROUNDS
            try:
                claims = await self.claim() if more else []
            except asyncio.CancelledError:
                inflight.cancel()  # its claims expire; the notices are retried with their uuids
                raise
            finally:
                await asyncio.wait([inflight])
        return attempted

    async def _send_round(self, claims: list["_Claim"]) -> None:
        """Send a round's claims (`send_concurrency` at a time), then record every result in one transaction."""
        sem = asyncio.Semaphore(self.settings.send_concurrency)

        async def one(c: "_Claim") -> "_Result | None":
            async with sem:
                try:
                    return await self._deliver(c)
                except Exception:  # the claim expires and the notice is retried with its uuid
                    log.exception("delivering notice %s failed", c.row.id)
                    return None

        async def in_order(turn: list["_Claim"]) -> list["_Result | None"]:
            done: list[_Result | None] = []
            for c in turn:
                done.append(await one(c))
                if done[-1] is None or done[-1].d.result != OK:
                    break  # the rest keep their claims until they expire: none overtakes the one that failed
            return done

        # One Turn's outputs go one after another, its answer's parts in their order: a reader sees part 1 first.
        turns: dict[str, list[_Claim]] = {}
        for c in claims:
            turns.setdefault(c.row.turn_id or c.row.id, []).append(c)
        for turn in turns.values():
            turn.sort(key=lambda c: (c.row.payload or {}).get("part", 0))
        sent = await asyncio.gather(*(in_order(turn) for turn in turns.values()))
        results = [x for turn in sent for x in turn if x is not None]
        if not results:
            return
        try:
            await self._record_round(results)
        except Exception:  # the claims expire and the notices are retried with their uuids
            log.exception("recording a round of %d results failed", len(results))

    async def _deliver(self, c: "_Claim") -> "_Result | None":
        r = c.row
        view = dict(r.payload)
        if r.kind == "update":
            return await self._deliver_update(c, view)
        if r.kind in rules.CHAT_KINDS:
            return await self._deliver_chat(c, view)
        card = None
        if r.kind == "reminder" and r.incident_id:
            card = await self._card(r.incident_id)
        if card and card[0] and rules.card_patchable(card[1], self.clock.now(), self.n):
            d = await self.channel.reply(r.app_id, card[0], view, r.request_uuid)
        else:
            d = await self.channel.send(r.app_id, c.recipient, view, r.request_uuid)
        return _Result(c, d, card_from_send=r.kind == "card")

    async def _card(self, incident_id: str) -> tuple[str | None, datetime | None, bool] | None:
        async with self.db.read() as conn:
            row = await self.incidents.card(conn, incident_id)
            pending_card = await self.outbox.card_pending(conn, incident_id)
        if row is None:
            return None
        return row.card_message_id, utc(row.card_sent_at), pending_card

    async def _deliver_update(self, c: "_Claim", view: dict) -> "_Result | None":
        r = c.row
        card = await self._card(r.incident_id) if r.incident_id else None
        now = self.clock.now()
        if card is None or not card[0]:
            if card is not None and card[2]:  # its card is still on the way: wait for its message id
                await self._release(c, now + timedelta(seconds=max(1.0, self.settings.poll_s)))
                return None
            await self._finish(c, NoticeState.SUPERSEDED,
                               detail="the incident has no card to update (folded, retired or dead)")
            return None
        if rules.card_patchable(card[1], now, self.n):
            d = await self.channel.update(r.app_id, card[0], view)
            if d.result != PERMANENT or not d.card_gone:
                return _Result(c, d, message_id=card[0])
        # Older than Feishu allows, recalled or deleted: send a fresh card and record its new message id.
        d = await self.channel.send(r.app_id, c.recipient, view, r.request_uuid)
        return _Result(c, d, card_from_send=True)

    async def _deliver_chat(self, c: "_Claim", view: dict) -> "_Result | None":
        """Deliver a chat output: the progress card and the answer's parts reply under the person's message; a card
        update PATCHes the progress card once it has a message id, after any earlier update still in flight."""
        r = c.row
        if r.kind != "chat_update":
            return _Result(c, await self.channel.reply(r.app_id, view["reply_to"], view, r.request_uuid))
        now = self.clock.now()
        async with self.db.read() as conn:
            card = await self.chats.card_message(conn, view["card_notice"])
            earlier = await self.chats.older_update_in_flight(conn, r.turn_id, r.id, utc(r.created_at), now)
        if card is None or card.state not in (LIVE, NoticeState.SENT):
            await self._finish(c, NoticeState.SUPERSEDED, detail="its progress card was not delivered")
            return None
        if card.state == LIVE or earlier:  # the card is on its way, or an earlier update is: keep the order
            await self._release(c, now + timedelta(seconds=CHAT_WAIT_S))
            return None
        d = await self.channel.update(r.app_id, card.message_id, view)
        return _Result(c, d, message_id=card.message_id)

    async def _release(self, c: "_Claim", when: datetime) -> None:
        await self.db.transaction(lambda conn: self.outbox.release(conn, c.row.id, self.worker_id, when))

    async def _finish(self, c: "_Claim", state: str, detail: str | None = None) -> None:
        now = self.clock.now()

        async def finish(conn: Connection) -> None:
            await self.outbox.finish(conn, c.row.id, self.worker_id, state)
            await self.notices.log(conn, now, state, detail=detail, notice_id=c.row.id, incident_id=c.row.incident_id,
                                   schedule_id=c.row.schedule_id)

        await self.db.transaction(finish)

    async def _record(self, c: "_Claim", d: Delivery, *, card_from_send: bool = False,
                      message_id: str | None = None) -> None:
        """Store one classified result (a round of one)."""
        await self._record_round([_Result(c, d, card_from_send=card_from_send, message_id=message_id)])

    async def _record_round(self, results: list["_Result"]) -> None:
        """Store a round's classified results in one transaction, each only while this worker still holds its
        claim; only a success records the message id (and the incident's card)."""
        now = self.clock.now()
        ok = [x for x in results if x.d.result == OK]

        async def record(conn: Connection) -> None:
            sent = [NoticeSent(notice_id=x.c.row.id, message_id=x.mid, attempts=x.c.row.attempts + 1) for x in ok]
            recorded = await self.outbox.record_sent_round(conn, self.worker_id, sent, now)
            done = [x for x in ok if x.c.row.id in recorded]
            for x in sorted((x for x in done if x.card_from_send and x.c.row.incident_id),
                            key=lambda x: x.c.row.incident_id):
                await self.incidents.set_card(conn, x.c.row.incident_id, x.mid, now)
            await self.incidents.log_many(conn, now, [NewDecision(
                decision_id=new_id("dec"), decision="sent", detail=f"{x.c.row.kind} delivered as {x.mid}",
                notice_id=x.c.row.id, incident_id=x.c.row.incident_id, schedule_id=x.c.row.schedule_id)
                for x in done])
            for x in results:
                if x.d.result != OK:
                    await self._record_failure(conn, x.c, x.d, now)

        await self.db.transaction(record)
        self.sent += len(ok)

    async def _record_failure(self, conn: Connection, c: "_Claim", d: Delivery, now: datetime) -> None:
        """Classify a failed attempt: retry (same uuid), end it, or suspend the application's delivery."""
        r = c.row
        refs = {"notice_id": r.id, "incident_id": r.incident_id, "schedule_id": r.schedule_id}
        attempts = r.attempts + 1
        verdict = PERMANENT if d.result == PERMANENT else (SUSPEND if d.result == SUSPEND else "retry")
        if verdict == SUSPEND and r.kind in rules.CHAT_KINDS:  # this person cannot be reached: not the admin's app
            verdict = PERMANENT
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


@dataclass(frozen=True)
class _Result:
    """A claim's classified delivery, waiting to be recorded with the rest of its round."""

    c: _Claim
    d: Delivery
    card_from_send: bool = False
    message_id: str | None = None

    @property
    def mid(self) -> str | None:
        """Return the message the notice became (the channel's answer, else the card it updated)."""
        return self.d.message_id or self.message_id
