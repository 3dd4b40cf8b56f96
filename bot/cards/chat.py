"""The chat's cards (pure): a Turn's live progress card, the card it becomes when the Turn ends, and the further
parts of an answer longer than one card.

The answer is the agent's own markdown, shown as is in one language-neutral `content` (no `i18n_content` copies,
so a part holds up to `PART_BYTES`); it is split at paragraph, then line, then character boundaries, a code
fence closed at the end of a part and reopened in the next, and each part says which of how many it is: an answer
is never cut.
"""
from __future__ import annotations

import re
from typing import Any

from bot.i18n import Catalogs, _
from hub.domain.tasks import RUNTIME_LOST, Status
from hub.services.chat.turns import ChatView

from .actions import StopTurn
from .base import button, button_row, card, check_limits, esc, hr, markdown, same
from .question import render_question
from .timeline import timeline_button

PART_BYTES = 20_000     # UTF-8 bytes of the answer on one card (Feishu takes 30 KB per card)
TOOLS_SHOWN = 8         # the newest tools listed on the progress card
ERROR_CHARS = 1_500
WAITING_SHOWN_S = 3.0   # a Turn still waiting after this long says why
MENTION = re.compile(r"<at\b", re.IGNORECASE)

ICONS = {"pending": "⏳", "running": "⏳", "completed": "✅", "failed": "❌"}
STEER = {
    "pending": _("Your message “{text}”: offered to the running turn…"),
    "delivered": _("Your message “{text}”: delivered to the running turn."),
    "queued": _("Your message “{text}”: queued — the agent cannot take it mid-turn, so it runs as the next turn."),
    "unknown": _("Your message “{text}”: unknown — the runner did not confirm it. Check the answer and send it "
                 "again if needed."),
}
QUEUED_NOT_STARTED = _("Your message “{text}”: queued — this turn had not started, so it runs as the next turn.")


def stop_action(turn_id: str) -> StopTurn:
    """Return the payload of the progress card's Stop button."""
    return StopTurn(turn_id=turn_id)


def elapsed(seconds: float) -> str:
    """Say a duration shortly: `42 s`, `3 min 05 s`, `1 h 02 min`."""
    s = int(seconds)
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


class ChatCardRenderer:
    """Render the chat's cards in both card languages (implements hub.services.chat.turns.ChatCards)."""

    def __init__(self, tr: Catalogs) -> None:
        self.tr = tr

    # ------------------------------------------------------------ while the Turn goes

    def progress(self, view: ChatView) -> dict[str, Any]:
        """Return the card of a Turn that has not ended: its status, elapsed time, tools in use, notes, Stop."""
        tr, status = self.tr, view.turn.get("status") or Status.QUEUED.value
        if status == Status.RUNNING.value:
            line = tr.text(_("**Working** · {elapsed}"), elapsed=elapsed(view.elapsed_s))
        else:
            waiting = view.turn.get("waiting_for")
            line = tr.text(_("**Waiting to start** · {elapsed}"), elapsed=elapsed(view.elapsed_s))
            if waiting and view.elapsed_s >= WAITING_SHOWN_S:  # a fresh Turn is only waiting for placement
                line = {k: f"{v}\n{esc(waiting)}" for k, v in line.items()}
        elements: list[dict[str, Any]] = [markdown(line)]
        tools = self._tools(view.tools)
        if tools:
            elements.append(markdown(tools))
        elements += self._notes(view.notes)
        elements += [hr(), button_row(button(tr.text(_("Stop")), stop_action(view.turn_id), "danger"),
                                      timeline_button(tr, "turn", view.turn_id))]
        return check_limits(card(tr.text(_("The agent is on it")), elements, template="blue"))

    def _tools(self, tools: list[dict[str, Any]]) -> dict[str, str] | None:
        latest: dict[str, dict[str, Any]] = {}
        for t in tools:  # a tool's later event (completed, failed) replaces its earlier one
            latest[t.get("id") or f"#{len(latest)}"] = t
        shown = list(latest.values())[-TOOLS_SHOWN:]
        if not shown:
            return None
        lines = [f"{ICONS.get(t.get('status') or '', '•')} {esc((t.get('title') or t.get('name') or '?')[:120])}"
                 for t in shown]
        more = len(latest) - len(shown)
        head = self.tr.text(_("**Tools** ({count})"), count=len(latest))
        tail = [self.tr.text(_("…and {n} earlier"), n=more)] if more else []
        return {k: "\n".join([head[k], *lines, *(x[k] for x in tail)]) for k in head}

    def _notes(self, notes: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        for n in notes:
            text = esc(n.get("text") or "")
            if n.get("kind") == "after_end":
                out.append(markdown(self.tr.text(_("Your previous turn had already ended, so this message started "
                                                   "a new turn."))))
            elif n.get("kind") == "behind":
                out.append(markdown(self.tr.text(_("Queued behind the turn that is running: it starts when that "
                                                   "one ends."))))
            elif n.get("kind") == "steer" and n.get("why") == "not_started":
                out.append(markdown(self.tr.text(QUEUED_NOT_STARTED, text=text)))
            elif n.get("kind") == "steer":
                out.append(markdown(self.tr.text(STEER.get(n.get("delivery") or "", STEER["unknown"]), text=text)))
        return out

    # ------------------------------------------------------------ when it ends

    def final(self, view: ChatView) -> list[dict[str, Any]]:
        """Return the card the progress card becomes (the answer, the question, or the outcome and what to do),
        then one card per further part of a long answer."""
        tr, turn = self.tr, view.turn
        status = turn.get("status")
        question = turn.get("question")
        if status == Status.WAITING_FOR_USER.value and question and question.get("state") == "open":
            return [render_question(tr, question)]
        foot = tr.text(_("{elapsed} · {tools} tools"), elapsed=elapsed(view.elapsed_s),
                       tools=len({t.get("id") for t in view.tools}))
        notes = self._notes([n for n in view.notes if n.get("kind") == "steer"])
        if status == Status.SUCCEEDED.value or status == Status.WAITING_FOR_USER.value:
            result = turn.get("result") if isinstance(turn.get("result"), dict) else {}
            parts = split_answer((result or {}).get("text") or "")
            if not parts:
                body = [markdown(tr.text(_("The agent finished without a written answer.")))]
                return [check_limits(card(tr.text(_("Done")), [*body, *notes, hr(), markdown(foot),
                                                               self._timeline(view)], "green"))]
            if len(parts) == 1:
                return [check_limits(card(tr.text(_("Done")), [_answer(parts[0]), *notes, hr(), markdown(foot),
                                                               self._timeline(view)], "green"))]
            n = len(parts)
            head = [markdown(tr.text(_("Done. The answer is long: it follows in {n} parts."), n=n))]
            cards = [check_limits(card(tr.text(_("Done")), [*head, *notes, hr(), markdown(foot), self._timeline(view)],
                                       "green"))]
            for i, p in enumerate(parts, 1):
                cards.append(check_limits(card(tr.text(_("Answer, part {i} of {n}"), i=i, n=n), [_answer(p)],
                                               "green")))
            return cards
        return [self._ended_card(turn, notes, foot, self._timeline(view))]

    def _timeline(self, view: ChatView) -> dict[str, Any]:
        return button_row(timeline_button(self.tr, "turn", view.turn_id))

    def _ended_card(self, turn: dict[str, Any], notes: list[dict[str, Any]], foot: dict[str, str],
                    timeline: dict[str, Any]) -> dict[str, Any]:
        tr, status = self.tr, turn.get("status")
        error = str(turn.get("error") or "")
        if status == Status.CANCELLED.value:
            title, template = tr.text(_("Stopped")), "grey"
            what = tr.text(_("The turn was stopped; nothing more will happen. Send a message to start again."))
        elif status == Status.TIMED_OUT.value:
            title, template = tr.text(_("Timed out")), "orange"
            what = tr.text(_("The turn ran out of time. Send a smaller request, or ask your admin to raise the "
                             "profile's timeout."))
        elif error == RUNTIME_LOST or error.startswith("runtime lost"):
            title, template = tr.text(_("The agent was interrupted")), "red"
            what = tr.text(_("Its runner stopped answering while it worked, so its outcome is unknown. Send your "
                             "message again."))
        elif status is None:
            title, template = tr.text(_("The agent was interrupted")), "red"
            what = tr.text(_("This turn is gone from the hub. Send your message again."))
        else:
            title, template = tr.text(_("The turn failed")), "red"
            what = tr.text(_("Read the error below, fix what it names, then send your message again."))
        body = [markdown(what)]
        if error:
            body.append(markdown(same(esc(error[:ERROR_CHARS]))))
        return check_limits(card(title, [*body, *notes, hr(), markdown(foot), timeline], template=template))


def _answer(text: str) -> dict[str, Any]:
    """Return the answer as one markdown element in every language (the agent's words are not translated)."""
    return {"tag": "markdown", "content": MENTION.sub("&lt;at", text)}


def split_answer(text: str, limit: int = PART_BYTES) -> list[str]:
    """Split `text` into parts of at most `limit` UTF-8 bytes at paragraph, line, then character boundaries; a code
    fence open at a cut is closed there and reopened in the next part. Nothing is dropped."""
    text = text.strip("\n")
    if not text.strip():
        return []
    pieces: list[str] = []
    for para in re.split(r"(\n\n)", text):
        if len(para.encode()) <= limit:
            pieces.append(para)
            continue
        for line in re.split(r"(\n)", para):
            while len(line.encode()) > limit:
                cut = _cut(line, limit)
                pieces.append(line[:cut])
                line = line[cut:]
            pieces.append(line)
    parts: list[str] = []
    current, fence = "", False
    budget = limit - 8  # room for a closing fence
    for piece in pieces:
        if current and len((current + piece).encode()) > budget:
            parts.append(current + ("\n```" if fence else ""))
            current = "```\n" if fence else ""
        current += piece
        fence ^= piece.count("```") % 2 == 1
    if current.strip():
        parts.append(current)
    return parts


def _cut(line: str, limit: int) -> int:
    """Return the number of characters of `line` that fit in `limit` UTF-8 bytes."""
    n = min(len(line), limit)
    while len(line[:n].encode()) > limit:
        n -= max(1, (len(line[:n].encode()) - limit) // 3)
    return max(1, n)
