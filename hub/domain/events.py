"""Canonical event projections: what of an engine event becomes durable task history."""
from __future__ import annotations

from typing import Any, Mapping

USAGE_KEYS = frozenset({
    "input_tokens", "output_tokens", "cached_input_tokens", "cache_creation_input_tokens",
    "cache_read_input_tokens", "reasoning_tokens", "total_tokens", "context_tokens",
    "context_window", "tokens_per_second",
})
TOOL_STATUSES = frozenset({"pending", "running", "completed", "failed"})


def clean_usage(raw: Any) -> dict[str, int]:
    """Keep only known nonnegative integer metrics."""
    if not isinstance(raw, Mapping):
        return {}
    return {k: v for k, v in raw.items()
            if k in USAGE_KEYS and isinstance(v, int) and not isinstance(v, bool) and v >= 0}


def turn_usage(raw: Any, turn_id: Any = None, current_turn: str | None = None) -> dict[str, int]:
    """Return the usage a run keeps: known nonnegative integer metrics of its exact Turn, else nothing.

    `turn_id` is the provider turn a usage report names (None: the stream names none, so the report is
    the run's own: Claude's `result`, `codex exec`'s `turn.completed`, pi's messages); `current_turn`
    is the provider turn this run started. A report naming another turn (an earlier turn of a reused
    thread, a turn someone else started on it) or naming one while the run's turn is not yet known is
    not this run's and is dropped whole.
    """
    if turn_id is not None and (current_turn is None or turn_id != current_turn):
        return {}
    return clean_usage(raw)


def redact_tool(raw: Any) -> dict[str, str]:
    """Keep a tool event's id, name, title and status; input, output, diff and locations stay off task history."""
    raw = raw if isinstance(raw, dict) else {}
    status = str(raw.get("status") or "completed")
    return {
        "id": str(raw.get("id") or "")[:200],
        "name": str(raw.get("name") or "")[:200],
        "title": str(raw.get("title") or "")[:500],
        "status": status if status in TOOL_STATUSES else "completed",
    }


def project(event_type: str, payload: dict[str, Any]) -> dict[str, Any] | None:
    """Return the durable payload for an event, or None when it is not kept."""
    if event_type == "tool":
        return {"tool": redact_tool(payload.get("tool"))}
    if event_type == "usage":
        usage = clean_usage(payload.get("usage"))
        return {"usage": usage} if usage else None
    if event_type in ("text", "question", "status", "warning", "permission"):
        return {k: v for k, v in payload.items() if isinstance(k, str)}
    return None
