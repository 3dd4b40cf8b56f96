"""Log lines (hub/logs.py): JSON or text, the request context on each, token secrets and configured secrets cut."""
from __future__ import annotations

import io
import json
import logging

import pytest

from hub import logs
from hub.config import LogSettings


@pytest.fixture
def stream():
    out = io.StringIO()
    root = logging.getLogger()
    before = (root.level, list(root.handlers))
    yield out
    for h in root.handlers:
        if getattr(h, "_amux_handler", False):
            root.removeHandler(h)
    root.setLevel(before[0])
    logging.getLogger(logs.ACCESS).setLevel(logging.NOTSET)


def test_a_json_line_carries_its_request_context_and_never_a_token_secret_or_configured_secret(stream):
    logs.configure(LogSettings(format="json", level="INFO"), secrets=["s3cret-value"], stream=stream)
    log = logging.getLogger("amux.test")
    log.info("outside any request")
    ctx, token = logs.open_request("abcd")
    logs.note_caller("alice", "laptop")
    try:
        log.warning("token amux.tok1.Zm9vYmFyYmF6cXV4 and handle task_7.abcdefghijkl and s3cret-value")
        try:
            raise RuntimeError("amux.tok2.QUJDREVGR0hJSktM")
        except RuntimeError:
            log.exception("failed")
    finally:
        logs.close_request(token)
    first, second, third = (json.loads(line) for line in stream.getvalue().splitlines())
    assert first["request_id"] is None and first["principal"] is None and first["logger"] == "amux.test"
    assert (second["request_id"], second["principal"], second["client"], second["level"]) == ("abcd", "alice",
                                                                                             "laptop", "WARNING")
    assert second["message"] == "token amux.tok1.*** and handle task_7.*** and ***"
    assert "QUJDREVGR0hJSktM" not in third["exc"] and "amux.tok2.***" in third["exc"]
    assert {"time", "level", "logger", "message", "request_id"} <= set(first)


def test_text_lines_say_the_request_and_access_lines_pass_whatever_the_level(stream):
    logs.configure(LogSettings(level="ERROR"), stream=stream)
    logging.getLogger("amux.test").warning("dropped: below the level")
    ctx, token = logs.open_request("beef")
    logging.getLogger("amux.test").error("kept")
    logs.close_request(token)
    logging.getLogger(logs.ACCESS).info("GET /healthz 200 0.1ms request_id=beef")
    lines = stream.getvalue().splitlines()
    assert len(lines) == 2 and lines[0].endswith("ERROR amux.test: kept request_id=beef")
    assert lines[1].endswith("INFO amux.access: GET /healthz 200 0.1ms request_id=beef")
    logs.configure(LogSettings(access=False), stream=stream)
    assert not logging.getLogger(logs.ACCESS).isEnabledFor(logging.INFO)


def test_the_environment_alone_configures_the_log_of_commands_without_a_configuration():
    assert logs.from_env({"AMUX_LOG__FORMAT": "json", "AMUX_LOG_LEVEL": "debug"})[0].model_dump() == {
        "format": "json", "level": "DEBUG", "access": True}
    settings, problem = logs.from_env({"AMUX_LOG__LEVEL": "loud"})
    assert settings.level == "WARNING" and "loud" in problem
