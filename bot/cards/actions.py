"""Typed, versioned card-action payloads (the `value` of a button's callback behavior).

Shaped like aiogram's CallbackData: `pack()` gives the JSON object the button carries, `unpack()`
parses and validates one coming back. A payload only *names* what was pressed; the handler always
re-authorizes the operator, so a forged or edited payload can do nothing its sender could not do anyway.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

PREFIX = "amux"
VERSION = 1
OPS = ("overview", "schedules", "detail", "history", "results", "pause", "resume", "delete",
       "alerts", "ack", "snooze", "recheck", "notify", "answer", "new", "edit", "save", "run", "stop")
NEEDS_SCHEDULE = ("detail", "history", "results", "pause", "resume", "delete", "notify", "edit", "run")
FORM_OPS = ("new", "edit", "save")  # the schedule form: open it empty, open it filled in, submit it
NEEDS_INCIDENT = ("ack", "snooze")
NEEDS_QUESTION = ("answer",)
NEEDS_TURN = ("stop",)  # the progress card's Stop: the chat Turn it interrupts
MAX_OPTION = 49  # a question offers at most 50 options (hub.runner.protocol.Question)
# which card the answer refreshes: "" the card pressed (alert center), "inc" a pushed incident card
VIEWS = ("", "inc")
MAX_PAGE = 10_000
KEYS = ("p", "v", "op", "s", "i", "pg", "sub", "vw", "q", "o", "n", "t")  # every key `pack()` writes


class BadPayload(ValueError):
    """The callback value is not a payload this version of the bot understands."""


class UnknownKey(BadPayload):
    """The callback value carries a key no payload of this version writes (as REST refuses an unknown field)."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = ", ".join(repr(k[:40]) for k in keys[:5])
        super().__init__(f"unknown keys {self.keys} in card action; a card action takes {list(KEYS)}")


@dataclass(frozen=True, kw_only=True)
class CardAction:
    """What a button asks for: an operation, its target and a page (0-based)."""

    op: str
    schedule_id: str | None = None
    incident_id: str | None = None
    page: int = 0
    sub: int = 0   # a second page index (the result part inside one firing)
    view: str = ""  # "inc": pressed on a pushed incident card, which the answer re-renders in place
    question_id: str | None = None  # "answer": the question a question card asks
    option: int = 0                 # "answer": the index of the option pressed
    nonce: str | None = None        # "save": this rendering of the form (a second submission of it makes nothing)
    turn_id: str | None = None      # "stop": the chat Turn the progress card shows

    def pack(self) -> dict[str, Any]:
        """Return the JSON value a button carries."""
        value: dict[str, Any] = {"p": PREFIX, "v": VERSION, "op": self.op}
        if self.schedule_id:
            value["s"] = self.schedule_id
        if self.incident_id:
            value["i"] = self.incident_id
        if self.page:
            value["pg"] = self.page
        if self.sub:
            value["sub"] = self.sub
        if self.view:
            value["vw"] = self.view
        if self.question_id:
            value["q"] = self.question_id
            value["o"] = self.option
        if self.nonce:
            value["n"] = self.nonce
        if self.turn_id:
            value["t"] = self.turn_id
        return value

    @classmethod
    def unpack(cls, value: Any) -> "CardAction":
        """Parse a callback value; raise BadPayload for anything malformed, foreign or from another version."""
        if not isinstance(value, dict) or value.get("p") != PREFIX:
            raise BadPayload("not an amux card action")
        if value.get("v") != VERSION:
            raise BadPayload(f"card action version {value.get('v')!r} is not supported; send /amux for a fresh card")
        unknown = sorted(str(k) for k in value if k not in KEYS)
        if unknown:
            raise UnknownKey(unknown)
        op = value.get("op")
        if op not in OPS:
            raise BadPayload(f"unknown card action {op!r}")
        sid, iid, qid, nonce, tid = value.get("s"), value.get("i"), value.get("q"), value.get("n"), value.get("t")
        page, sub, view, option = value.get("pg", 0), value.get("sub", 0), value.get("vw", ""), value.get("o", 0)
        for name, v in (("s", sid), ("i", iid), ("q", qid), ("n", nonce), ("t", tid)):
            if v is not None and (not isinstance(v, str) or not v or len(v) > 64):
                raise BadPayload(f"bad {name} in card action")
        for v in (page, sub):
            if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_PAGE:
                raise BadPayload("bad page in card action")
        if op in NEEDS_SCHEDULE and not sid:
            raise BadPayload(f"{op} needs a schedule")
        if op in NEEDS_INCIDENT and not iid:
            raise BadPayload(f"{op} needs an incident")
        if (op in NEEDS_QUESTION) != bool(qid):
            raise BadPayload(f"{op} needs a question" if qid is None else "only answer names a question")
        if not isinstance(option, int) or isinstance(option, bool) or not 0 <= option <= MAX_OPTION:
            raise BadPayload("bad option in card action")
        if (op == "save") != bool(nonce):
            raise BadPayload("save needs the form's nonce" if nonce is None else "only save carries a nonce")
        if (op in NEEDS_TURN) != bool(tid):
            raise BadPayload(f"{op} needs a turn" if tid is None else "only stop names a turn")
        if view not in VIEWS or (view == "inc" and not iid):
            raise BadPayload("bad view in card action")
        return cls(op=op, schedule_id=sid, incident_id=iid, page=page, sub=sub, view=view, question_id=qid,
                   option=option, nonce=nonce, turn_id=tid)
