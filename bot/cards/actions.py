"""Typed, versioned payloads: one class per thing the bot can be asked (a card button or a text command).

Card actions are shaped like aiogram's CallbackData: each subclass of `CardAction` names its `op` and declares its
fields; `pack()` gives the JSON object the button carries, `CardAction.unpack()` parses and validates one coming
back. Defining a subclass registers its op (`OPS`); a handler binds to the class with `@handles(...)`
(bot/handlers/context.py), and the router (bot/router.py) dispatches on the class, so the buttons' ops and the
routes come from the same classes. Text commands (`/amux …`) are payload classes too (`Command`) and go through
the same router. A payload only *names* what was asked; the handler always re-authorizes the operator, so a forged
or edited payload can do nothing its sender could not do anyway.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, ClassVar

PREFIX = "amux"
VERSION = 1
MAX_OPTION = 49  # a question offers at most 50 options (hub.runner.protocol.Question)
# which card the answer refreshes: "" the card pressed (alert center), "inc" a pushed incident card
VIEWS = ("", "inc")
MAX_PAGE = 10_000
MAX_ID = 64
# field → the key `pack()` writes for it
KEY_OF = {"schedule_id": "s", "incident_id": "i", "page": "pg", "sub": "sub", "view": "vw", "question_id": "q",
          "option": "o", "nonce": "n", "run_id": "r", "run_kind": "k", "turn_id": "t"}
FIELD_OF = {k: f for f, k in KEY_OF.items()}
KEYS = ("p", "v", "op", *KEY_OF.values())  # every key `pack()` writes
NEEDS = {"schedule_id": "a schedule", "incident_id": "an incident", "question_id": "a question",
         "nonce": "the form's nonce", "run_id": "a task or turn", "turn_id": "a chat turn"}
RUN_KINDS = ("task", "turn")  # Timeline: whose Agent Timeline the button opens
BOUNDS = {"page": MAX_PAGE, "sub": MAX_PAGE, "option": MAX_OPTION}

class BadPayload(ValueError):
    """The callback value is not a payload this version of the bot understands."""


class UnknownKey(BadPayload):
    """The callback value carries a key no payload of this version writes (as REST refuses an unknown field)."""

    def __init__(self, keys: list[str]) -> None:
        self.keys = ", ".join(repr(k[:40]) for k in keys[:5])
        super().__init__(f"unknown keys {self.keys} in card action; a card action takes {list(KEYS)}")


ACTIONS: dict[str, type[CardAction]] = {}   # op → its payload class, filled by defining a subclass


@dataclass(frozen=True, kw_only=True)
class CardAction:
    """What a button asks for; a subclass per op declares the fields that op takes (ids, a page, an option)."""

    op: ClassVar[str]

    def __init_subclass__(cls, op: str = "", **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if op:
            cls.op = op
            ACTIONS[op] = cls

    @classmethod
    def of(cls, op: str, **fields: Any) -> CardAction:
        """Return the payload of `op` with `fields` (for a button whose op is chosen at run time)."""
        return ACTIONS[op](**fields)

    def pack(self) -> dict[str, Any]:
        """Return the JSON value a button carries (fields at their default are left out)."""
        value: dict[str, Any] = {"p": PREFIX, "v": VERSION, "op": self.op}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v != f.default or f.default is dataclasses.MISSING:
                value[KEY_OF[f.name]] = v
        return value

    @staticmethod
    def unpack(value: Any) -> CardAction:
        """Parse a callback value; raise BadPayload for anything malformed, foreign or from another version."""
        if not isinstance(value, dict) or value.get("p") != PREFIX:
            raise BadPayload("not an amux card action")
        if value.get("v") != VERSION:
            raise BadPayload(f"card action version {value.get('v')!r} is not supported; send /amux for a fresh card")
        unknown = sorted(str(k) for k in value if k not in KEYS)
        if unknown:
            raise UnknownKey(unknown)
        op = value.get("op")
        cls = ACTIONS.get(op) if isinstance(op, str) else None
        if cls is None:
            raise BadPayload(f"unknown card action {op!r}")
        fields = {f.name: f for f in dataclasses.fields(cls)}
        args: dict[str, Any] = {}
        for key, v in value.items():
            name = FIELD_OF.get(key)
            if name is None:
                continue
            if name not in fields:
                raise BadPayload(f"{op} takes no {name}")
            args[name] = _checked(name, v)
        for name, f in fields.items():
            if name not in args and f.default is dataclasses.MISSING:
                raise BadPayload(f"{op} needs {NEEDS.get(name, name)}")
        action = cls(**args)
        action.validate()
        return action

    def validate(self) -> None:
        """Refuse a combination of fields this op does not take (a subclass adds its own rule)."""


def _checked(name: str, v: Any) -> Any:
    if name == "view":
        if v not in VIEWS:
            raise BadPayload("bad view in card action")
        return v
    if name == "run_kind":
        if v not in RUN_KINDS:
            raise BadPayload("bad k in card action")
        return v
    if name in BOUNDS:
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= BOUNDS[name]:
            raise BadPayload(f"bad {name} in card action")
        return v
    if not isinstance(v, str) or not v or len(v) > MAX_ID:
        raise BadPayload(f"bad {KEY_OF[name]} in card action")
    return v


# ------------------------------------------------------------ the card actions


@dataclass(frozen=True, kw_only=True)
class Overview(CardAction, op="overview"):
    """The personal summary (also `/amux`)."""


@dataclass(frozen=True, kw_only=True)
class Schedules(CardAction, op="schedules"):
    """One page (0-based) of the viewer's schedules."""

    page: int = 0


@dataclass(frozen=True, kw_only=True)
class OnSchedule(CardAction):
    """An action on one schedule of the viewer's."""

    schedule_id: str


@dataclass(frozen=True, kw_only=True)
class Detail(OnSchedule, op="detail"):
    """One schedule: rule, next fire, last outcomes and controls."""


@dataclass(frozen=True, kw_only=True)
class History(OnSchedule, op="history"):
    """One page of a schedule's firings."""

    page: int = 0


@dataclass(frozen=True, kw_only=True)
class Results(OnSchedule, op="results"):
    """One firing's results (`page`: the firing, `sub`: the part of its result)."""

    page: int = 0
    sub: int = 0


@dataclass(frozen=True, kw_only=True)
class Pause(OnSchedule, op="pause"):
    """Pause the schedule."""


@dataclass(frozen=True, kw_only=True)
class Resume(OnSchedule, op="resume"):
    """Resume the schedule."""


@dataclass(frozen=True, kw_only=True)
class Delete(OnSchedule, op="delete"):
    """Delete the schedule."""


@dataclass(frozen=True, kw_only=True)
class Notify(OnSchedule, op="notify"):
    """Set which outcomes reach the administrator (`sub`: the index in NOTIFY_MODES)."""

    sub: int = 0


@dataclass(frozen=True, kw_only=True)
class RunNow(OnSchedule, op="run"):
    """Fire the schedule once, now."""


@dataclass(frozen=True, kw_only=True)
class NewForm(CardAction, op="new"):
    """Open the New schedule form."""


@dataclass(frozen=True, kw_only=True)
class EditForm(OnSchedule, op="edit"):
    """Open the schedule form filled in with this schedule."""


@dataclass(frozen=True, kw_only=True)
class Save(CardAction, op="save"):
    """Submit the schedule form: create (no schedule) or change one; `nonce` names this rendering of the form."""

    nonce: str
    schedule_id: str | None = None


FORM_ACTIONS = (NewForm, EditForm, Save)  # the schedule form: open it empty, open it filled in, submit it


@dataclass(frozen=True, kw_only=True)
class Alerts(CardAction, op="alerts"):
    """The administrator's alert center, one page."""

    page: int = 0


@dataclass(frozen=True, kw_only=True)
class OnIncident(CardAction):
    """An alert action, pressed on the alert center (`view=""`, answered with its `page`) or on a pushed incident
    card (`view="inc"`, answered with that card re-rendered)."""

    page: int = 0
    view: str = ""

    def validate(self) -> None:
        if self.view == "inc" and not self.target:
            raise BadPayload("bad view in card action")

    @property
    def target(self) -> str | None:
        """The incident acted on (None: the application as a whole)."""
        return None


@dataclass(frozen=True, kw_only=True)
class Ack(OnIncident, op="ack"):
    """Acknowledge an incident: its reminders stop."""

    incident_id: str

    @property
    def target(self) -> str | None:
        return self.incident_id


@dataclass(frozen=True, kw_only=True)
class Snooze(OnIncident, op="snooze"):
    """Hold an incident's reminders for 24 hours."""

    incident_id: str

    @property
    def target(self) -> str | None:
        return self.incident_id


@dataclass(frozen=True, kw_only=True)
class Recheck(OnIncident, op="recheck"):
    """Lift the application's delivery suspension and retry held notices (pressed on an incident card or not)."""

    incident_id: str | None = None

    @property
    def target(self) -> str | None:
        return self.incident_id


@dataclass(frozen=True, kw_only=True)
class AnswerQuestion(CardAction, op="answer"):
    """Answer a question card with the option pressed."""

    question_id: str
    option: int = 0

    def pack(self) -> dict[str, Any]:
        return {**super().pack(), "o": self.option}  # the option always, 0 included


@dataclass(frozen=True, kw_only=True)
class Timeline(CardAction, op="timeline"):
    """Open the Agent Timeline of a Task (`run_kind` task) or a Turn: the clicker is sent a sign-in link to it."""

    run_id: str
    run_kind: str = "task"


@dataclass(frozen=True, kw_only=True)
class StopTurn(CardAction, op="stop"):
    """Stop the chat Turn a progress card shows (bot/handlers/conversation.py)."""

    turn_id: str


# ------------------------------------------------------------ text commands


COMMANDS: dict[str, type[Command]] = {}   # the word after `/amux` → its payload class


@dataclass(frozen=True, kw_only=True)
class Command:
    """A text command (`/amux WORD ARGS`); `word` is what the person types, `usage` how help shows it."""

    word: ClassVar[str]
    usage: ClassVar[str]

    def __init_subclass__(cls, word: str = "", **kw: Any) -> None:
        super().__init_subclass__(**kw)
        if word:
            cls.word = word
            COMMANDS[word] = cls

    @classmethod
    def parse(cls, args: str) -> Command:
        """Return the command with `args` (the words after the command word)."""
        return cls()


PREFIXES = ("/amux", "amux")


def parse_text(text: str) -> CardAction | Command | None:
    """Return what a chat message asks of the bot: `/amux` → Overview, `/amux WORD …` → that command (an unknown
    word → Help naming it); None for any other message (a Turn of the chat's Session)."""
    words = text.strip().split()
    if not words or words[0].lower() not in PREFIXES:
        return None
    if len(words) == 1:
        return Overview()
    cls = COMMANDS.get(words[1].lower())
    if cls is None:
        return Help(unknown=words[1][:MAX_ID])
    return cls.parse(" ".join(words[2:]))


@dataclass(frozen=True, kw_only=True)
class Help(Command, word="help"):
    """What the bot understands; `unknown` is a command word it does not know."""

    usage: ClassVar[str] = "/amux help"
    unknown: str = ""


@dataclass(frozen=True, kw_only=True)
class Login(Command, word="login"):
    """A one-time sign-in link for the hub's OAuth approval page."""

    usage: ClassVar[str] = "/amux login"


@dataclass(frozen=True, kw_only=True)
class Link(Command, word="link"):
    """Bind this Feishu identity to the principal of a link code (`amux identity link`)."""

    usage: ClassVar[str] = "/amux link CODE"
    code: str = ""

    @classmethod
    def parse(cls, args: str) -> Command:
        return cls(code=args)
