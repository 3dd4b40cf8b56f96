"""Hostile input gets a clear 4xx naming the fix, the same on SQLite and PostgreSQL; nothing answers 500."""
from __future__ import annotations

import json
import logging

import httpx2
import pytest

from tests.helpers import mcp_client

NUL = "a\x00b"
SURROGATE = '{"prompt": "\\ud800 hi", "profile": "scripted"}'


def deep(n: int) -> str:
    return "[" * n + "]" * n


# (method, path, body-or-None, content) — every case must answer a 4xx with a JSON error that names a fix
CASES = [
    ("GET", "/api/v1/tasks/%00", None),
    ("GET", "/api/v1/sessions/%00", None),
    ("GET", "/api/v1/schedules/%00", None),
    ("GET", "/api/v1/memory/a%00b", None),
    ("GET", "/api/v1/tasks?limit=1e20", None),
    ("GET", "/api/v1/tasks/tr_x/events?cursor=1e23", None),
    ("GET", "/api/v1/tasks/tr_x/events?cursor=99999999999", None),
    ("GET", "/api/v1/tasks/tr_x/wait?cursor=2147483648", None),
    ("GET", "/api/v1/tasks/tr_x/wait?timeout_s=nan", None),
    ("GET", "/api/v1/schedules/sch_x/history?limit=1e20", None),
    ("POST", "/api/v1/tasks", json.dumps({"prompt": NUL, "profile": "scripted"})),
    ("POST", "/api/v1/tasks", SURROGATE),
    ("POST", "/api/v1/tasks", json.dumps({"prompt": "hi", "name": NUL, "profile": "scripted"})),
    ("POST", "/api/v1/tasks", deep(5000)),
    ("POST", "/api/v1/tasks", "[1]"),
    ("POST", "/api/v1/tasks", "{not json"),
    ("POST", "/api/v1/tasks", json.dumps({"prompt": 5, "profile": "scripted"})),
    ("PUT", "/api/v1/memory/k", json.dumps({"value": NUL})),
    ("PUT", "/api/v1/memory/k%00", json.dumps({"value": "v"})),
    ("POST", "/api/v1/sessions", json.dumps({"name": 5})),
    ("POST", "/api/v1/sessions", json.dumps({"name": ["a"]})),
    ("POST", "/api/v1/sessions", json.dumps({"name": NUL})),
    ("POST", "/api/v1/schedules", json.dumps({"name": "x", "prompt": "say hi", "rule": "every 99999999999999999999d",
                                              "profile": "scripted"})),
    ("POST", "/api/v1/schedules", json.dumps({"name": NUL, "prompt": "say hi", "rule": "every 5m"})),
]


@pytest.mark.parametrize("method,path,body", CASES, ids=[f"{m} {p} {(b or '')[:30]!r}" for m, p, b in CASES])
async def test_hostile_rest_input_answers_4xx_naming_the_fix_on_both_stores(any_hub, method, path, body, caplog):
    caplog.set_level(logging.ERROR)
    async with httpx2.AsyncClient(timeout=10) as http:
        resp = await http.request(method, f"{any_hub.url}{path}", content=body,
                                  headers={"Authorization": f"Bearer {any_hub.admin_token}",
                                           "Content-Type": "application/json"})
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text[:300])
    data = resp.json()
    assert data["error"] and (data.get("fix") or data.get("message")), data
    assert "Traceback" not in caplog.text


async def test_turn_text_and_timeout_are_checked_before_anything_runs(any_hub):
    await any_hub.start_runner()
    headers = {"Authorization": f"Bearer {any_hub.admin_token}"}
    async with httpx2.AsyncClient(timeout=10) as http:
        created = await http.post(f"{any_hub.url}/api/v1/sessions", json={"name": "s1", "profile": "scripted"},
                                  headers=headers)
        assert created.status_code == 201, created.text
        ref = created.json()["session_id"]
        for body in ({"text": NUL}, {"text": "say hi", "wait": True, "timeout_s": "abc"}, {"text": ["x"]}):
            resp = await http.post(f"{any_hub.url}/api/v1/sessions/{ref}/turns", json=body, headers=headers)
            assert resp.status_code == 400, (body, resp.text)


async def test_unauthenticated_hostile_input_is_refused_without_a_500(any_hub):
    async with httpx2.AsyncClient(timeout=10) as http:
        for url in ("/boxes?token=amux.%00.x", "/api/v1/tasks/%00", "/mcp"):
            resp = await http.get(f"{any_hub.url}{url}")
            assert 400 <= resp.status_code < 500, (url, resp.status_code, resp.text[:200])


async def test_nul_bytes_and_surrogates_over_mcp_are_tool_errors_naming_the_field(any_hub):
    await any_hub.start_runner()
    async with mcp_client(any_hub.url, any_hub.admin_token) as c:
        res = await c.call_tool("task_submit", {"prompt": NUL, "profile": "scripted"})
        assert res.is_error and "`prompt` contains a NUL byte" in res.content[0].text
        res = await c.call_tool("task_get", {"task_id": "tr_\x00"})
        assert res.is_error and "`task_id`" in res.content[0].text
        res = await c.call_tool("schedule_create", {"name": "x", "prompt": "say hi", "profile": "scripted",
                                                    "rule": "every 99999999999999999999d"})
        assert res.is_error and "`at` rule" in res.content[0].text
    # an unpaired surrogate cannot even be encoded by a Python client: send the JSON escape itself; the SDK's
    # strict JSON parser refuses it as a JSON-RPC parse error before any tool runs
    call = ('{"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": "task_submit", '
            '"arguments": {"prompt": "x\\ud800", "profile": "scripted"}}}')
    async with httpx2.AsyncClient(timeout=10) as http:
        resp = await http.post(f"{any_hub.url}/mcp", content=call, headers={
            "Authorization": f"Bearer {any_hub.admin_token}", "Content-Type": "application/json",
            "Accept": "application/json, text/event-stream", "MCP-Protocol-Version": "2025-06-18"})
    assert resp.status_code == 400 and resp.json()["error"]["code"] == -32700, resp.text


async def test_an_unexpected_failure_answers_500_json_with_a_request_id_and_logs_no_user_content(any_hub, caplog):
    caplog.set_level(logging.ERROR, logger="amux.web")

    secret = "secret prompt " + "text"

    async def broken(*_a, **_k):  # a service failing in a way nobody planned for, with user content in its message
        raise RuntimeError(secret)

    any_hub.hub.tasks.list = broken
    async with httpx2.AsyncClient(timeout=10) as http:
        resp = await http.get(f"{any_hub.url}/api/v1/tasks", headers={"Authorization": f"Bearer {any_hub.admin_token}"})
    assert resp.status_code == 500
    body = resp.json()
    assert body["error"] == "internal" and body["request_id"] in body["fix"]
    assert resp.headers["X-Request-Id"] == body["request_id"]
    assert body["request_id"] in caplog.text and "RuntimeError" in caplog.text
    assert "secret prompt text" not in caplog.text


async def test_credential_declare_by_a_non_admin_answers_403_naming_what_is_needed(any_hub):
    token = await any_hub.token("alice")
    async with httpx2.AsyncClient(timeout=10) as http:
        resp = await http.put(f"{any_hub.url}/api/v1/credentials/anthropic", json={"env": ["ANTHROPIC_API_KEY"]},
                              headers={"Authorization": f"Bearer {token}"})
    assert resp.status_code == 403 and "admin" in resp.json()["fix"]
