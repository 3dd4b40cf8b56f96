"""What of an engine event becomes durable task history."""
from __future__ import annotations

from hub.domain.events import clean_usage, project, redact_tool, turn_usage


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


# turn_usage: what a run keeps of one usage report (its metrics, and whose Turn it is), one case per rule
USAGE = {"input_tokens": 10, "output_tokens": 5}


def test_a_report_that_names_no_turn_is_the_runs_own_and_keeps_its_known_metrics():
    assert turn_usage({**USAGE, "bogus": 7}) == USAGE


def test_a_report_of_the_runs_exact_turn_is_kept():
    assert turn_usage(USAGE, "turn_2", "turn_2") == USAGE


def test_a_report_of_another_turn_of_the_same_thread_is_dropped_whole():
    assert turn_usage(USAGE, "turn_1", "turn_2") == {}


def test_a_report_that_names_a_turn_before_the_run_knows_its_own_is_dropped():
    assert turn_usage(USAGE, "turn_1", None) == {}


def test_negative_fractional_boolean_and_unknown_metrics_are_dropped_from_a_kept_report():
    raw = {"output_tokens": -1, "input_tokens": 2.0, "total_tokens": True, "bogus": 7, "cached_input_tokens": 0}
    assert turn_usage(raw, "t", "t") == {"cached_input_tokens": 0}


def test_a_report_that_is_not_a_mapping_keeps_nothing():
    assert turn_usage([("input_tokens", 1)]) == {} and turn_usage(None) == {} and turn_usage("12") == {}
