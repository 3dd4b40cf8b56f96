"""How the adapters read a CLI's model-API retries: status text, the final cause, and when to stop at once."""
from __future__ import annotations

import pytest

from hub.engines.claude import ApiRetry
from hub.engines.codex import NETWORK_WAITS, Retries


def claude_retry(attempt: int, error: str, status: int | None, max_retries: int = 10) -> ApiRetry:
    return ApiRetry.of({"type": "system", "subtype": "api_retry", "attempt": attempt, "max_retries": max_retries,
                        "retry_delay_ms": 500.0, "error_status": status, "error": error})


@pytest.mark.parametrize("error,status,cause", [
    ("unknown", None, "connection error"),            # no HTTP answer at all (refused, DNS, reset)
    ("authentication_failed", 401, "credential rejected, HTTP 401"),
    ("rate_limit", 429, "rate limited, HTTP 429"),
    ("overloaded", 529, "API overloaded, HTTP 529"),
    ("server_error", 503, "server error, HTTP 503"),
    ("unknown", 400, "unknown, HTTP 400"),
])
def test_claude_retry_categories_read_as_causes(error, status, cause):
    r = claude_retry(3, error, status)
    assert r.cause == cause
    assert r.event()["text"] == f"engine retrying: attempt 3 of 10 ({cause})"


def test_claude_giving_up_on_an_unreachable_api_names_the_attempts_and_what_to_check():
    assert claude_retry(10, "unknown", None).gave_up() == (
        "the model API was unreachable after 10 attempts; check the network and the credential profile")


def test_claude_giving_up_on_another_cause_names_it():
    assert (claude_retry(4, "overloaded", 529, 4).gave_up()
            == "the model API kept failing (API overloaded, HTTP 529) after 4 attempts")


def test_a_mistyped_retry_line_reads_as_zero_attempts_of_an_unknown_error():
    r = ApiRetry.of({"attempt": "3", "max_retries": True, "error_status": "401"})
    assert (r.attempt, r.max_retries, r.http_status, r.cause) == (0, 0, None, "connection error")


CAUSE = "unexpected status 401 Unauthorized: Incorrect API key provided: sk-test, url: http://127.0.0.1:9/v1/responses"


def test_codex_bounded_reconnects_are_status_events_until_a_key_is_rejected_twice():
    r = Retries()
    status, failure = r.read(f"Reconnecting... 1/5 ({CAUSE})")
    assert status["text"] == f"engine retrying: attempt 1 of 5 ({CAUSE})" and failure is None
    status, failure = r.read(f"Reconnecting... 2/5 ({CAUSE})")
    assert failure == f"the model API rejected the credential; fix the credential profile (codex: {CAUSE})"


def test_codex_bounded_reconnects_of_other_causes_never_end_the_run():
    r = Retries()
    for n in range(1, 6):
        status, failure = r.read(f"Reconnecting... {n}/5 (stream disconnected before completion: error "
                                 "sending request)")
        assert failure is None and status["retry"] == {"attempt": n, "max_retries": 5,
                                                       "cause": "stream disconnected before completion: error "
                                                                "sending request"}


def test_codex_endless_network_wait_ends_at_the_third_report_naming_the_cause():
    r = Retries()
    message = "Reconnecting... waiting for network (Connection failed: error sending request)"
    for n in range(1, NETWORK_WAITS):
        status, failure = r.read(message)
        assert failure is None
        assert status["text"] == (f"engine retrying: attempt {n} of {NETWORK_WAITS} "
                                  "(waiting for the network: Connection failed: error sending request)")
    _, failure = r.read(message)
    assert failure == ("the model API was unreachable after 3 attempts; check the network and the credential profile "
                       "(codex: Connection failed: error sending request)")


def test_other_codex_errors_are_no_retries():
    assert Retries().read("unexpected status 400 Bad Request: unknown model") == (None, None)
