"""Any other chat message: a Turn of that chat's Session; the agent's answer is posted back."""
from __future__ import annotations

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from bot.identity import Viewer

from hub.store.tables import bot_chats

ANSWER_LIMIT = 20_000  # characters of the agent's answer posted back in one text message


async def chat_session(hub, v: Viewer, chat_id: str) -> str:  # noqa: ANN001
    """Return the Session of (application, chat, operator), creating it on the first message."""
    async with hub.db.read() as conn:
        sid = (await conn.execute(sa.select(bot_chats.c.session_id).where(
            bot_chats.c.app_id == v.app_id, bot_chats.c.chat_id == chat_id,
            bot_chats.c.principal_id == v.principal_id))).scalar()
    if sid:
        return sid
    try:
        async with hub.db.write() as conn:
            s = await hub.sessions.create(v.caller(), source="feishu", conn=conn)
            await conn.execute(bot_chats.insert().values(app_id=v.app_id, chat_id=chat_id, principal_id=v.principal_id,
                                                         session_id=s["session_id"], created_at=hub.clock.now()))
            return s["session_id"]
    except IntegrityError:
        return await chat_session(hub, v, chat_id)


async def converse(hub, v: Viewer, chat_id: str, text: str, wait_s: float,  # noqa: ANN001
                   message_id: str | None = None) -> tuple[str, str]:
    """Submit `text` as a Turn and wait for it; return (turn id, answer text)."""
    sid = await chat_session(hub, v, chat_id)
    receipt = {"app_id": v.app_id, "binding_id": v.binding_id, "open_id": v.open_id, "chat_id": chat_id,
               "message_id": message_id}
    turn_id = await hub.sessions.submit_turn(v.caller(), sid, text, source="feishu", receipt=receipt)
    view = await hub.sessions.wait_turn(v.caller(), turn_id, timeout_s=wait_s)
    result = (view.get("result") or {}).get("text") if isinstance(view.get("result"), dict) else None
    answer = result or view.get("error") or f"[{view.get('status')}]"
    return turn_id, answer[:ANSWER_LIMIT]
