"""What the Feishu bot keeps in the database: each chat's Session, long-connection leases, inbound dedup keys."""
from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING

from ...clock import Clock
from ...store.bot import Duplicate, SqlBotStore
from ...store.db import Connection, Database
from ..auth.service import Caller

if TYPE_CHECKING:
    from ..sessions.service import SessionService


INBOUND_TTL = timedelta(days=2)  # inbound dedup keys kept: Feishu retries an event for a few hours at most


class EngineRefused(Exception):
    """A chat's first message would create its Session on an engine the caller refused (the scripted test engine
    by default); nothing was created."""


class BotService:
    """The bot's state, shared by every replica (the bot's handlers and transports call this, never the store)."""

    def __init__(self, db: Database, clock: Clock, sessions: SessionService | None = None) -> None:
        self.db = db
        self.clock = clock
        self.sessions = sessions
        self.store = SqlBotStore(db)

    async def chat_session(self, caller: Caller, app_id: str, chat_id: str, principal_id: str, *,
                           profile: str | None = None, refuse_engine: str | None = None) -> str:
        """Return the Session of (application, chat, operator), creating it on the first message with `profile`
        (None: the hub's default) — two first messages at once: both get the one that was created first. A new
        Session that would run on `refuse_engine` raises EngineRefused, nothing created."""
        if self.sessions is None:
            raise RuntimeError("BotService was built without sessions; pass the hub's SessionService")
        while True:
            async with self.db.read() as conn:
                sid = await self.store.session_of_chat(conn, app_id, chat_id, principal_id)
            if sid:
                return sid
            async def create(conn: Connection, sessions: SessionService = self.sessions) -> str:
                s = await sessions.create(caller, source="feishu", profile=profile, conn=conn)
                if refuse_engine is not None and s["engine"] == refuse_engine:
                    raise EngineRefused(s["engine"])
                await self.store.add_chat(conn, app_id=app_id, chat_id=chat_id, principal_id=principal_id,
                                          session_id=s["session_id"], now=self.clock.now())
                return str(s["session_id"])

            try:
                return await self.db.transaction(create)
            except Duplicate:
                continue  # the other message's Session won (ours was rolled back with its binding): read it

    async def claim_lease(self, name: str, holder: str, lease_s: float) -> bool:
        """Take or renew lease `name` for `holder` for `lease_s` seconds; False while another holder's is live."""
        now = self.clock.now()
        try:
            async with self.db.write() as conn:
                return await self.store.claim_lease(conn, name, holder, now=now, until=now + timedelta(seconds=lease_s))
        except Duplicate:
            return False

    async def release_leases(self, holder: str) -> None:
        """Give up every lease `holder` has, so another replica can take them without waiting for expiry."""
        async with self.db.write() as conn:
            await self.store.release_leases(conn, holder)

    async def first_seen(self, app_id: str, key: str, keep: timedelta, *, prune: bool = False) -> bool:
        """Record an inbound key; False when it was seen before (a redelivery or a replay). `prune` also forgets
        keys older than `keep`."""
        now = self.clock.now()

        async def record(conn: Connection) -> None:
            await self.store.first_seen(conn, app_id, key, now)
            if prune:
                await self.store.prune_inbound(conn, now - keep)

        try:
            await self.db.transaction(record)
            return True
        except Duplicate:
            return False
