"""The Agent Timeline's rules: what of an agent event is kept raw, how secrets are cut from it, how big it may be.

Task events keep a tool's id, name, title and status only (`events.project`); the timeline keeps the rest —
input, output, diff, locations, text — for the run's owner and admins. Credential values are replaced by the
runner before an event leaves it (`hub.runner.agent.Redactor`); what is cut here is what looks like a token
whatever its origin: amux tokens and lease handles (their id stays), bearer headers, and well-known key shapes.
"""
from __future__ import annotations

import re
from datetime import datetime, timedelta
from typing import Any

REDACTED = "[redacted]"
MAX_STRING = 64 * 1024  # one string of a raw event (a tool's output can be a whole file)
MAX_ITEMS = 500  # entries of one list or object of a raw event
MAX_DEPTH = 12
# The one-time login link's `next` may name only a timeline page of this hub: never an open redirect.
NEXT_PATH = re.compile(r"/timeline/(tasks|turns)/[A-Za-z0-9_-]{1,40}")
# `amux.<id>.<secret>` tokens and `task_<id>.<secret>` lease handles: the id stays, the secret goes.
AMUX_TOKEN = re.compile(r"\b(amux\.[A-Za-z0-9_-]+\.|task_[A-Za-z0-9]+\.)[A-Za-z0-9_-]{8,}")
_KEY_SHAPES = re.compile(
    r"(?i)\b(bearer\s+)[A-Za-z0-9._~+/=-]{12,}"              # Authorization: Bearer …
    r"|\b(sk-(?:ant-|proj-)?)[A-Za-z0-9_-]{16,}"              # Anthropic / OpenAI keys
    r"|\b(gh[pousr]_)[A-Za-z0-9]{20,}"                         # GitHub tokens
    r"|\b(xox[abprs]-)[A-Za-z0-9-]{10,}"                       # Slack tokens
    r"|\b(AKIA)[A-Z0-9]{16}\b"                                 # AWS access key ids
    r"|\b((?:t|u)-g[0-9a-z]{4,}_)[A-Za-z0-9_-]{16,}"           # Feishu tenant / user access tokens
)
# Keys whose value is a secret whatever it looks like (an env dump, a config file read by a tool).
_SECRET_KEY = re.compile(r"(?i)(password|passwd|secret|token|api[_-]?key|authorization|credential)")


def safe_next(path: object) -> str | None:
    """Return `path` when a sign-in may land there (a timeline page: same origin, no query), else None."""
    return path if isinstance(path, str) and NEXT_PATH.fullmatch(path) else None


def page_path(kind: str, run_id: str) -> str:
    """Return the timeline page of a run (`kind` task or turn)."""
    return f"/timeline/{'tasks' if kind == 'task' else 'turns'}/{run_id}"


def scrub_text(text: str) -> str:
    """Return `text` with token secrets and key-shaped strings replaced (a token's id and a key's prefix stay)."""
    text = AMUX_TOKEN.sub(r"\1" + REDACTED, text)
    return _KEY_SHAPES.sub(lambda m: next(g for g in m.groups() if g is not None) + REDACTED, text)


def _bounded_text(text: str) -> str:
    if len(text) <= MAX_STRING:
        return text
    return f"{text[:MAX_STRING]}… [{len(text) - MAX_STRING} more characters not kept]"


def raw_payload(value: Any, depth: int = 0) -> Any:
    """Return a JSON value fit for the timeline: secrets scrubbed, strings, lists and objects bounded."""
    if isinstance(value, str):
        return _bounded_text(scrub_text(value))
    if isinstance(value, bool) or value is None or isinstance(value, (int, float)):
        return value
    if depth >= MAX_DEPTH:
        return "[nested too deep: not kept]"
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for i, (k, v) in enumerate(value.items()):
            if i >= MAX_ITEMS:
                out["…"] = f"{len(value) - MAX_ITEMS} more entries not kept"
                break
            key = str(k)[:200]
            secret = isinstance(v, str) and bool(v) and _SECRET_KEY.search(key) is not None
            out[key] = REDACTED if secret else raw_payload(v, depth + 1)
        return out
    if isinstance(value, (list, tuple)):
        items = [raw_payload(v, depth + 1) for v in value[:MAX_ITEMS]]
        if len(value) > MAX_ITEMS:
            items.append(f"{len(value) - MAX_ITEMS} more items not kept")
        return items
    return _bounded_text(scrub_text(str(value)))


def expired_before(now: datetime, retention_s: float) -> datetime:
    """Return the time before which timeline events are past their retention."""
    return now - timedelta(seconds=retention_s)
