"""Tasks over the official MCP SDK client against a running hub."""
from __future__ import annotations

import json

import pytest

from tests.helpers import mcp_client

SCRIPT = "say hello\ntool Read 'read the readme'\nusage input=10 output=5\nwrite notes/out.txt hi\nsay done"


async def test_task_run_over_mcp_reaches_succeeded_with_result_usage_and_changed_files(any_hub):
    await any_hub.start_runner()
    async with mcp_client(any_hub.url, any_hub.admin_token) as c:
        res = await c.call_tool("task_run", {"prompt": SCRIPT, "profile": "scripted", "name": "demo"})
    assert not res.is_error, res.content
    t = res.structured_content
    assert t["status"] == "succeeded" and t["outcome"] == "succeeded"
    assert t["result"]["text"] == "hello\ndone"
    assert t["usage"] == {"input_tokens": 10, "output_tokens": 5}
    assert t["changed_files"]["created"] == ["notes/out.txt"]
    assert t["snapshot"]["engine"] == "scripted" and t["snapshot"]["permission_policy"] == "policy-allow"
