"""Any other chat message: a Turn of that chat's Session; the agent's answer is posted back."""
from __future__ import annotations

from typing import TYPE_CHECKING

from bot.identity import Viewer

if TYPE_CHECKING:
    from bot.services import BotServices

ANSWER_LIMIT = 20_000  # characters of the agent's answer posted back in one text message


async def chat_session(services: BotServices, v: Viewer, chat_id: str) -> str:
    """Return the Session of (application, chat, operator), creating it on the first message."""
    return await services.state.chat_session(v.caller(), v.app_id, chat_id, v.principal_id)


async def converse(services: BotServices, v: Viewer, chat_id: str, text: str, wait_s: float,
                   message_id: str | None = None) -> tuple[str, str]:
    """Submit `text` as a Turn and wait for it; return (turn id, answer text)."""
    sid = await chat_session(services, v, chat_id)
    receipt = {"app_id": v.app_id, "binding_id": v.binding_id, "open_id": v.open_id, "chat_id": chat_id,
               "message_id": message_id}
    turn_id = await services.sessions.submit_turn(v.caller(), sid, text, source="feishu", receipt=receipt)
    view = await services.sessions.wait_turn(v.caller(), turn_id, timeout_s=wait_s)
    result = (view.get("result") or {}).get("text") if isinstance(view.get("result"), dict) else None
    answer = result or view.get("error") or f"[{view.get('status')}]"
    return turn_id, answer[:ANSWER_LIMIT]
