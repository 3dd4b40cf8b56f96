"""SqlChatTurnStore on SQLite and PostgreSQL: the steering of a chat's running Turn."""
from __future__ import annotations

import pytest

from hub.clock import ManualClock
from hub.store.chat_turns import SqlChatTurnStore
from hub.store.db import Database


@pytest.fixture
def store(db: Database) -> SqlChatTurnStore:
    """A chat-turn store over an empty database."""
    return SqlChatTurnStore(db)


async def test_a_steers_full_text_is_read_back_and_empty_when_there_is_no_such_steer(store, clock: ManualClock):
    text = "use the staging database, not production; " * 10  # longer than the 200 characters a note keeps
    async with store.db.write() as conn:
        await store.add_steer(conn, message_id="mb_1", turn_id="tr_1", text=text, now=clock.now())
    async with store.db.read() as conn:
        assert await store.mail_state(conn, "mb_1") == "pending"
        assert await store.steer_text(conn, "mb_1") == text
        assert await store.steer_text(conn, "mb_missing") == ""
