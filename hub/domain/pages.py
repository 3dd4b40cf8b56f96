"""How much one list answer holds: a limit outside the range is refused, naming the maximum, never cut short."""
from __future__ import annotations

from typing import Any

from ..errors import Invalid

MAX_TASKS = 500        # GET /api/v1/tasks
MAX_SESSIONS = 500     # GET /api/v1/sessions, session_list
MAX_SCHEDULES = 1000   # GET /api/v1/schedules, schedule_list
MAX_TURNS = 200        # session_get's recent runs
MAX_INSTANCES = 200    # GET /api/v1/instances, amux instance list


def page_limit(limit: Any, maximum: int, what: str, name: str = "limit") -> int:
    """Return `limit` when it is a whole number from 1 to `maximum`; refuse it otherwise, naming the range."""
    if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
        raise Invalid(f"{name} must be a whole number from 1 to {maximum}, e.g. 20; got {limit!r}")
    if limit > maximum:
        raise Invalid(f"{name} {limit} is above the maximum of {maximum} {what} one answer holds; "
                      f"ask for at most {maximum}")
    return limit
