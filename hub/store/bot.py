"""The Feishu bot's own rows: chat sessions, connection leases and the inbound dedup keys."""
from __future__ import annotations

from datetime import datetime, timezone

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from .db import Connection, Database
from .tables import bot_chats, bot_inbound, bot_leases


class Duplicate(Exception):
    """Another replica (or a concurrent event) wrote the same row first."""


class SqlBotStore:
    """What the bot keeps between events, shared by every replica."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # ------------------------------------------------------------ chats

    async def session_of_chat(self, conn: Connection, app_id: str, chat_id: str, principal_id: str) -> str | None:
        """Return the Session of (application, chat, operator), if the chat has one."""
        return (await conn.execute(sa.select(bot_chats.c.session_id).where(
            bot_chats.c.app_id == app_id, bot_chats.c.chat_id == chat_id,
            bot_chats.c.principal_id == principal_id))).scalar()

    async def add_chat(self, conn: Connection, *, app_id: str, chat_id: str, principal_id: str, session_id: str,
                       now: datetime) -> None:
        """Bind (application, chat, operator) to `session_id`; one Session per chat and operator: a second
        binding raises Duplicate."""
        try:
            await conn.execute(bot_chats.insert().values(app_id=app_id, chat_id=chat_id, principal_id=principal_id,
                                                         session_id=session_id, created_at=now))
        except IntegrityError as e:
            raise Duplicate(f"chat {chat_id} of {app_id} has a Session already") from e

    # ------------------------------------------------------------ leases

    async def claim_lease(self, conn: Connection, name: str, holder: str, *, now: datetime, until: datetime) -> bool:
        """Take or renew lease `name` for `holder` until `until`, unless another holder's lease is still live at
        `now`; say whether `holder` holds it. Replicas racing to create it: one wins, the others raise Duplicate."""
        row = (await conn.execute(self.db.for_update(sa.select(bot_leases).where(bot_leases.c.name == name)))).first()
        if row is None:
            try:
                await conn.execute(bot_leases.insert().values(name=name, holder=holder, expires_at=until))
            except IntegrityError as e:
                raise Duplicate(f"lease {name} was created concurrently") from e
            return True
        if row.holder != holder and _aware(row.expires_at) > now:
            return False
        await conn.execute(bot_leases.update().where(bot_leases.c.name == name).values(holder=holder, expires_at=until))
        return True

    async def lease_holder(self, conn: Connection, name: str) -> tuple[str, datetime] | None:
        """Return who holds lease `name` and until when (None: nobody ever took it)."""
        row = (await conn.execute(sa.select(bot_leases).where(bot_leases.c.name == name))).first()
        return None if row is None else (row.holder, _aware(row.expires_at))

    async def release_leases(self, conn: Connection, holder: str) -> int:
        """Drop every lease `holder` has (live or not), so another replica may take them at once; return how many."""
        return int((await conn.execute(bot_leases.delete().where(bot_leases.c.holder == holder))).rowcount)

    # ------------------------------------------------------------ inbound dedup

    async def first_seen(self, conn: Connection, app_id: str, key: str, now: datetime) -> None:
        """Record inbound `key` (cut to 250 characters) of `app_id`; a key recorded before raises Duplicate (a
        redelivery or a replay)."""
        try:
            await conn.execute(bot_inbound.insert().values(key=key[:250], app_id=app_id, received_at=now))
        except IntegrityError as e:
            raise Duplicate("inbound key seen before") from e

    async def prune_inbound(self, conn: Connection, before: datetime) -> int:
        """Forget inbound keys received before `before` (past Feishu's retry window); return how many."""
        return int((await conn.execute(bot_inbound.delete().where(bot_inbound.c.received_at < before))).rowcount)


def _aware(dt: datetime) -> datetime:
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt  # SQLite drops tzinfo
