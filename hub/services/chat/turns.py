"""The chat flow: a chat message's Turn, its live progress card and its answer, driven from the database.

A chat message opens a Turn and, in the same transaction, queues its progress card in the outbox and records the
chat Turn (`chat_turns`). A driver loop on every replica claims due chat Turns (`SKIP LOCKED`), reads the Turn's
persisted status and tool events, and queues a card update when what the card shows changed — at most one per
`chat_update_s` while the Turn runs — and, once the Turn is terminal, the final card (plus the answer's further
parts when it is longer than one card) before marking the chat Turn done, all in one transaction. Nothing waits in
memory for an answer: a replica that dies mid-Turn leaves its rows to any other, and the outbox delivers each
output once under its stable uuid. A message sent while the Turn runs steers it (a pending steer its runner
settles as delivered or queued; unsettled after `steer_wait_s` it is unknown); a steer the engine could not take
becomes the Session's next Turn, queued behind this one.
"""
from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Protocol

from ...clock import Clock, utc
from ...domain.tasks import Status, is_terminal
from ...errors import NotFound
from ...ids import new_id
from ...store.chat_turns import DONE, RUNNING, NewChatTurn, SqlChatTurnStore
from ...store.db import Connection, Database, Row
from ..auth.service import Caller
from ..notify import Notifier
from ..alerts.outbox import Notices
from ..sessions.service import SessionService

CHAT_TZ = "UTC"        # chat outputs ignore quiet hours: the person is waiting for them
CLAIM_BATCH = 50
WATCH_MAX = 10_000  # chat Turns a replica wakes for at once; older ones fall back to the poll


@dataclass(frozen=True, kw_only=True)
class ChatView:
    """What a progress or final card shows about one chat Turn."""

    turn_id: str
    turn: dict[str, Any]               # SessionService's Turn view (status, result, error, question, waiting_for)
    tools: list[dict[str, Any]]        # redacted tool records (id, name, title, status), oldest first
    notes: list[dict[str, Any]]        # what became of messages sent during the Turn, and why it started
    elapsed_s: float


class ChatCards(Protocol):
    """Render chat cards (the bot implements it; the hub never imports the bot)."""

    def progress(self, view: ChatView) -> dict[str, Any]:
        """Return the card of a Turn that has not ended."""

    def final(self, view: ChatView) -> list[dict[str, Any]]:
        """Return the card the progress card becomes, then the cards of the answer's further parts, in order."""


@dataclass(frozen=True, kw_only=True)
class ChatOrigin:
    """Where a chat Turn came from and where its cards go."""

    app_id: str
    chat_id: str
    open_id: str
    principal_id: str
    session_id: str
    reply_to: str                      # the message the progress card answers
    receipt: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class Steered:
    """What became of a message sent while the chat's Turn was going: steering it, or the next Turn."""

    delivery: str                      # pending (offered to the running Turn) | queued (the next Turn) | ended
    turn_id: str                       # the running Turn
    next_turn_id: str | None = None


class ChatTurnService:
    """Open chat Turns, steer and stop them, and drive their cards to the answer (one loop per replica)."""

    def __init__(self, db: Database, clock: Clock, notifier: Notifier, sessions: SessionService, cards: ChatCards,
                 *, update_s: float = 2.0, steer_wait_s: float = 5.0, poll_s: float = 0.25) -> None:
        self.db = db
        self.clock = clock
        self.notifier = notifier
        self.sessions = sessions
        self.cards = cards
        self.update_s = update_s
        self.steer_wait_s = steer_wait_s
        self.poll_s = poll_s
        self.store = SqlChatTurnStore(db)
        self.notices = Notices(db)
        self.kicked = asyncio.Event()  # the driver (`step`)
        self.outputs_due = asyncio.Event()  # the chat outbox's loop: a card or an answer was queued
        self._hints: set[str] = set()  # tasks this replica heard change: the chat Turns among them are made due
        # Chat Turns this replica opened or drove: a change of one wakes the driver at once. Any other task's change
        # waits for the next poll (most tasks are not chat Turns; other replicas' Turns are found by polling).
        self._watching: dict[str, None] = {}
        notifier.listen("task:", self._heard)

    def _heard(self, key: str) -> None:
        task_id = key[len("task:"):]
        self._hints.add(task_id)
        if task_id in self._watching:
            self.kicked.set()

    def _watch(self, turn_id: str) -> None:
        self._watching[turn_id] = None
        while len(self._watching) > WATCH_MAX:
            del self._watching[next(iter(self._watching))]

    def kick(self) -> None:
        """Run the driver and the chat outbox now."""
        self.kicked.set()
        self.outputs_due.set()

    # ------------------------------------------------------------ opening

    async def open(self, caller: Caller, origin: ChatOrigin, text: str, notes: list[dict[str, Any]] | None = None,
                   conn: Connection | None = None) -> str:
        """Submit `text` as the Session's next Turn and queue its progress card, in one transaction; return the
        Turn's id."""
        if conn is not None:
            return await self._open(conn, caller, origin, text, notes or [])
        turn_id = await self.db.transaction(lambda c: self._open(c, caller, origin, text, notes or []))
        self.sessions.on_admitted()
        self.kick()
        return turn_id

    async def _open(self, conn: Connection, caller: Caller, origin: ChatOrigin, text: str,
                    notes: list[dict[str, Any]]) -> str:
        turn_id = await self.sessions.submit_turn_in(conn, caller, origin.session_id, text, source="feishu",
                                                     receipt=origin.receipt)
        await self._record(conn, origin, turn_id, notes)
        return turn_id

    async def answered(self, caller: Caller, origin: ChatOrigin, question_id: str, option: int) -> dict:
        """Answer a question card's option as the Session's next Turn, with its own progress card under the
        question card (`origin.reply_to`), in one transaction; return SessionService.answer_question's view."""
        async def record(conn: Connection, turn_id: str) -> None:
            run = await self.store.run(conn, turn_id)
            if run is None:
                raise NotFound(f"turn {turn_id} is gone; send your message again")
            await self._record(conn, replace(origin, session_id=run.session_id), turn_id, [])

        sent = await self.sessions.answer_question(caller, question_id, option=option, source="feishu",
                                                   receipt=origin.receipt, also=record)
        self.kick()
        return sent

    async def _record(self, conn: Connection, origin: ChatOrigin, turn_id: str, notes: list[dict[str, Any]]) -> None:
        self._watch(turn_id)
        now = self.clock.now()
        view = await self._view(conn, turn_id, notes, now)
        card = self.cards.progress(view)
        nid = await self.notices.queue(conn, now, app_id=origin.app_id, recipient=origin.open_id, kind="chat_card",
                                       payload={"v": 1, "kind": "chat", "card": card, "reply_to": origin.reply_to},
                                       timezone=CHAT_TZ, turn_id=turn_id)
        await self.store.add(conn, NewChatTurn(
            turn_id=turn_id, app_id=origin.app_id, chat_id=origin.chat_id, open_id=origin.open_id,
            principal_id=origin.principal_id, session_id=origin.session_id, reply_to=origin.reply_to,
            card_notice_id=nid, notes=notes), now)
        await self.store.save(conn, turn_id, rendered=_digest(card), next_check_at=now + timedelta(
            seconds=self.update_s))

    async def say(self, app_id: str, open_id: str, reply_to: str, card: dict[str, Any]) -> str:
        """Queue `card` as a reply under `reply_to` (a refusal or a hint in the chat); return the notice id."""
        async with self.db.write() as conn:
            nid = await self.notices.queue(conn, self.clock.now(), app_id=app_id, recipient=open_id,
                                           kind="chat_part", timezone=CHAT_TZ,
                                           payload={"v": 1, "kind": "chat", "card": card, "reply_to": reply_to})
        self.kick()
        return nid

    # ------------------------------------------------------------ steering and stopping

    async def send(self, caller: Caller, origin: ChatOrigin, text: str) -> Steered | str:
        """A chat message, in one transaction: steer the chat's running Turn with it (`steer`), or open a Turn for
        it when the chat runs none; return what became of it (the new Turn's id when it opened one)."""
        async def steer_or_open(conn: Connection) -> tuple[Steered | str, Row | None]:
            steered, run = await self._steer(conn, caller, origin, text)
            return (steered, run) if steered is not None else (await self._open(conn, caller, origin, text, []), None)

        result, run = await self.db.transaction(steer_or_open)
        self._steered(result, run)
        return result

    async def steer(self, caller: Caller, origin: ChatOrigin, text: str) -> Steered | None:
        """Route a chat message while the chat has a running chat Turn: offer it to the running Turn, or queue it as
        the Session's next Turn when that Turn has not started; None when the chat has no running chat Turn (the
        message opens a Turn). `delivery` ended: the Turn had just ended, the message opened the next Turn."""
        result, run = await self.db.transaction(lambda conn: self._steer(conn, caller, origin, text))
        if result is not None:
            self._steered(result, run)
        return result

    def _steered(self, result: Steered | str, run: Row | None) -> None:
        """After `send` or `steer` commits: wake the runner of a steered run, placement, and the driver."""
        if run is not None and run.runtime_id:
            self.notifier.notify(f"runtime:{run.runtime_id}")
        if isinstance(result, str) or result.next_turn_id:
            self.sessions.on_admitted()
        self.kick()

    async def _steer(self, conn: Connection, caller: Caller, origin: ChatOrigin,
                     text: str) -> tuple[Steered | None, Row | None]:
        """`steer`'s transaction: what became of the message (None: the chat runs no chat Turn) and the run."""
        now = self.clock.now()
        ct = await self.store.running_in_chat(conn, origin.app_id, origin.chat_id, origin.principal_id)
        if ct is None:
            return None, None
        run = await self.store.run(conn, ct.turn_id)
        status = run.status if run is not None else Status.FAILED.value
        short = text.strip()[:200]
        if is_terminal(status):
            nxt = await self._open(conn, caller, origin, text, [{"kind": "after_end", "turn": ct.turn_id}])
            return Steered(delivery="ended", turn_id=ct.turn_id, next_turn_id=nxt), run
        if status == Status.RUNNING.value:
            mid = new_id("mb")
            await self.store.add_steer(conn, message_id=mid, turn_id=ct.turn_id, text=text, now=now)
            notes = list(ct.notes) + [{"kind": "steer", "mail": mid, "text": short, "delivery": "pending",
                                       "reply_to": origin.reply_to, "at": now.isoformat()}]
            await self.store.save(conn, ct.turn_id, notes=notes, next_check_at=now)
            return Steered(delivery="pending", turn_id=ct.turn_id), run
        nxt = await self._open(conn, caller, origin, text, [{"kind": "behind", "turn": ct.turn_id}])
        notes = list(ct.notes) + [{"kind": "steer", "text": short, "delivery": "queued", "next_turn": nxt,
                                   "why": "not_started"}]
        await self.store.save(conn, ct.turn_id, notes=notes, next_check_at=now)
        return Steered(delivery="queued", turn_id=ct.turn_id, next_turn_id=nxt), run

    async def chat_turn(self, turn_id: str) -> dict[str, Any] | None:
        """Return the chat Turn `turn_id` (application, person, state) with its run's `status`; None when it is no
        chat Turn."""
        async with self.db.read() as conn:
            ct = await self.store.get(conn, turn_id)
            run = await self.store.run(conn, turn_id) if ct is not None else None
        if ct is None:
            return None
        return {"turn_id": ct.turn_id, "app_id": ct.app_id, "principal_id": ct.principal_id, "state": ct.state,
                "status": run.status if run is not None else None}

    async def touched(self, turn_id: str) -> None:
        """Make the chat Turn's card due for a check now (its Turn was stopped, say)."""
        async with self.db.write() as conn:
            await self.store.due_now(conn, [turn_id], self.clock.now())
        self.kick()

    async def recent(self, app_id: str, limit: int = 20) -> list[dict[str, Any]]:
        """Return the application's newest chat Turns with their status (the console lists them)."""
        async with self.db.read() as conn:
            rows = await self.store.recent(conn, app_id, limit)
            out = []
            for r in rows:
                run = await self.store.run(conn, r.turn_id)
                out.append({"turn_id": r.turn_id, "chat_id": r.chat_id, "state": r.state,
                            "status": run.status if run else None, "notes": list(r.notes)})
        return out

    async def outputs(self, app_id: str, chat_id: str, principal_id: str, open_id: str,
                      limit: int = 20) -> list[dict[str, Any]]:
        """Return what the chat shows, whatever the channel delivered: one entry per message the bot posts (its id
        is the notice's), a progress card as its newest update; oldest first (the console renders them)."""
        async with self.db.read() as conn:
            rows = await self.store.outputs(conn, app_id, chat_id, principal_id, open_id, limit)
        shown: dict[str, dict[str, Any]] = {}
        cards: dict[str, str] = {}  # turn → its progress card's notice
        for r in rows:
            if r.kind == "chat_update":
                nid = cards.get(r.turn_id or "")
                if nid is not None:
                    shown[nid]["card"] = r.payload["card"]
                continue
            if r.kind == "chat_card" and r.turn_id:
                cards[r.turn_id] = r.id
            shown[r.id] = {"id": r.id, "turn_id": r.turn_id, "reply_to": r.payload.get("reply_to"),
                           "card": r.payload["card"]}
        return list(shown.values())

    # ------------------------------------------------------------ the driver

    async def step(self) -> float:
        """Drive due chat Turns once; again at once while a full batch came, else after `poll_s`."""
        now = self.clock.now()
        hints, self._hints = self._hints, set()
        if hints:  # every task's change is heard: take the write lock only for the chat Turns among them
            async with self.db.read() as conn:
                turns = await self.store.running_among(conn, hints)
            if turns:
                await self.db.transaction(lambda conn: self.store.due_now(conn, turns, now))
        async with self.db.read() as conn:
            if not await self.store.any_due(conn, now):
                return self.poll_s

        async def drive(conn: Connection) -> int:
            rows = await self.store.lock_due(conn, now, CLAIM_BATCH)
            for ct in rows:
                self._watch(ct.turn_id)
                await self._drive(conn, ct, now)
            return len(rows)

        driven = await self.db.transaction(drive)
        if driven:
            self.outputs_due.set()  # what the pass queued (updates, answers) goes out now
        return 0.0 if driven >= CLAIM_BATCH else self.poll_s

    async def _drive(self, conn: Connection, ct: Row, now: datetime) -> None:
        notes = await self._settle_notes(conn, ct, now)
        view = await self._view(conn, ct.turn_id, notes, now)
        status = view.turn.get("status")
        if status is None or is_terminal(status):
            cards = self.cards.final(view)
            await self._queue_update(conn, ct, cards[0], now)
            for i, part in enumerate(cards[1:], 1):
                await self.notices.queue(conn, now, app_id=ct.app_id, recipient=ct.open_id, kind="chat_part",
                                         payload={"v": 1, "kind": "chat", "card": part, "reply_to": ct.reply_to,
                                                  "part": i},
                                         timezone=CHAT_TZ, turn_id=ct.turn_id)
            await self.store.save(conn, ct.turn_id, state=DONE, notes=notes, rendered=_digest(cards[0]),
                                  updated_at=now, next_check_at=now)
            self._watching.pop(ct.turn_id, None)
            return
        card = self.cards.progress(view)
        digest = _digest(card)
        last = utc(ct.updated_at) or now
        due = last + timedelta(seconds=self.update_s)
        values: dict[str, Any] = {"notes": notes}
        if digest != ct.rendered and now >= due:
            await self._queue_update(conn, ct, card, now)
            values.update(rendered=digest, updated_at=now)
            due = now + timedelta(seconds=self.update_s)
        pending = any(n.get("delivery") == "pending" for n in notes)
        values["next_check_at"] = min(due, now + timedelta(seconds=self.poll_s)) if pending else due
        await self.store.save(conn, ct.turn_id, **values)

    async def _queue_update(self, conn: Connection, ct: Row, card: dict[str, Any], now: datetime) -> None:
        await self.store.supersede_updates(conn, ct.turn_id)
        await self.notices.queue(conn, now, app_id=ct.app_id, recipient=ct.open_id, kind="chat_update",
                                 payload={"v": 1, "kind": "chat", "card": card, "card_notice": ct.card_notice_id},
                                 timezone=CHAT_TZ, turn_id=ct.turn_id)

    async def _settle_notes(self, conn: Connection, ct: Row, now: datetime) -> list[dict[str, Any]]:
        """Follow each pending steer: delivered, queued (it becomes the next Turn) or, unsettled after
        `steer_wait_s`, unknown."""
        notes = [dict(n) for n in ct.notes]
        for n in notes:
            if n.get("delivery") != "pending":
                continue
            state = await self.store.mail_state(conn, n["mail"])
            at = datetime.fromisoformat(n["at"])
            if state == "pending" and now - at >= timedelta(seconds=self.steer_wait_s):
                if await self.store.give_up_steer(conn, n["mail"], now):
                    state = "unknown"
                else:
                    state = await self.store.mail_state(conn, n["mail"])
            if state == "queued":
                owner = Caller(ct.principal_id, ct.open_id, f"chat:{ct.turn_id}", f"feishu:{ct.app_id}", False)
                origin = ChatOrigin(app_id=ct.app_id, chat_id=ct.chat_id, open_id=ct.open_id,
                                    principal_id=ct.principal_id, session_id=ct.session_id,
                                    reply_to=n.get("reply_to") or ct.reply_to,
                                    receipt={"app_id": ct.app_id, "open_id": ct.open_id, "chat_id": ct.chat_id})
                text = await self.store.steer_text(conn, n["mail"])
                n["next_turn"] = await self._open(conn, owner, origin, text, [{"kind": "behind", "turn": ct.turn_id}])
                n["why"] = "engine"
                self.sessions.on_admitted()
            if state in ("delivered", "queued", "unknown"):
                n["delivery"] = state
        return notes

    async def _view(self, conn: Connection, turn_id: str, notes: list[dict[str, Any]], now: datetime) -> ChatView:
        turn = await self.sessions.turn_view(conn, turn_id) or {}
        run = await self.store.run(conn, turn_id)
        start = utc(run.started_at) or utc(run.created_at) if run is not None else now
        end = utc(run.finished_at) if run is not None and run.finished_at else now
        return ChatView(turn_id=turn_id, turn=turn, tools=await self.store.tool_events(conn, turn_id), notes=notes,
                        elapsed_s=max(0.0, (end - (start or now)).total_seconds()))


def _digest(card: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(card, sort_keys=True, ensure_ascii=False).encode()).hexdigest()


__all__ = ["ChatCards", "ChatOrigin", "ChatTurnService", "ChatView", "Steered", "RUNNING", "DONE"]
