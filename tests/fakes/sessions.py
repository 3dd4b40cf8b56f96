"""A small in-memory SessionPort: records the turns it receives; tests set their outcomes."""
from __future__ import annotations

import itertools

from hub.errors import Invalid, NotFound
from hub.services.auth.service import Caller


class FakeSessions:
    """Sessions by name for one test; `outcomes[turn_id]` is what turn_outcome reports."""

    def __init__(self, names: dict[str, str] | None = None) -> None:
        self.names = names or {"main": "ses_1"}
        self.turns: list[dict] = []
        self.outcomes: dict[str, str | None] = {}
        self.refuse: str | None = None
        self._ids = itertools.count(1)

    async def resolve_ref(self, caller: Caller, ref: str) -> str:
        """Resolve a name or id; 'dup' is ambiguous."""
        if ref == "dup":
            raise Invalid("session-ref 'dup' names 2 sessions; use the id")
        if ref in self.names.values():
            return ref
        if ref not in self.names:
            raise NotFound(f"no session {ref!r}; create one first")
        return self.names[ref]

    async def submit_turn(self, caller: Caller, session_id: str, prompt: str, source: str = "schedule") -> str:
        """Record the turn and return its id (or refuse when `refuse` is set)."""
        if self.refuse:
            raise Invalid(self.refuse)
        turn_id = f"turn_{next(self._ids)}"
        self.turns.append({"turn_id": turn_id, "session_id": session_id, "prompt": prompt, "source": source,
                           "principal": caller.principal})
        self.outcomes[turn_id] = None
        return turn_id

    async def turn_outcome(self, turn_id: str) -> str | None:
        """Return the outcome the test set."""
        return self.outcomes[turn_id]
