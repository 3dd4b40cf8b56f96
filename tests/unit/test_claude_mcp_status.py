"""A Session Turn's Claude init names the hub's MCP server's state: only a state that will not connect warns."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from hub.engines.claude import _ClaudeStream
from hub.engines.hubmcp import SERVER, TOKEN_VAR

ENV = {"AMUX_SESSION_ID": "ses_1", "AMUX_HUB_URL": "http://127.0.0.1:1", TOKEN_VAR: "amux.t"}


@pytest.mark.parametrize(("status", "warns"), [("connected", False), ("pending", False), ("failed", True),
                                               ("needs-auth", True), (None, True)])
async def test_the_hubs_mcp_server_warns_only_when_it_will_not_connect(status, warns):
    emitted: list[tuple[str, dict]] = []

    async def emit(kind: str, payload: dict) -> None:
        emitted.append((kind, payload))

    stream = _ClaudeStream(SimpleNamespace(env=ENV, snapshot={}), emit, SimpleNamespace())
    servers = [] if status is None else [{"name": SERVER, "status": status}]
    await stream._init({"type": "system", "subtype": "init", "session_id": "s", "mcp_servers": servers})
    warnings = [p["text"] for k, p in emitted if k == "warning"]
    assert bool(warnings) is warns
    if warns:
        assert f"did not connect ({status or 'absent'})" in warnings[0]
