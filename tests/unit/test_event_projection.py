"""What of an engine event becomes durable task history."""
from __future__ import annotations

from hub.domain.events import clean_usage, project, redact_tool


def test_tool_events_keep_only_id_name_title_and_status():
    raw = {"id": "t1", "name": "Edit", "title": "edit a.py", "status": "completed",
           "input": {"path": "a.py"}, "output": "secret", "diff": "+x", "locations": ["a.py:1"]}
    assert redact_tool(raw) == {"id": "t1", "name": "Edit", "title": "edit a.py", "status": "completed"}
    assert project("tool", {"tool": raw}) == {"tool": redact_tool(raw)}


def test_usage_keeps_only_known_nonnegative_integer_metrics():
    assert clean_usage({"input_tokens": 3, "output_tokens": -1, "cost_usd": 2, "reasoning_tokens": 1.5,
                        "context_tokens": True, "total_tokens": 9}) == {"input_tokens": 3, "total_tokens": 9}


def test_a_usage_event_without_known_metrics_is_not_kept():
    assert project("usage", {"usage": {"cost": 1}}) is None


def test_unknown_event_types_are_not_kept():
    assert project("raw_stream", {"x": 1}) is None
