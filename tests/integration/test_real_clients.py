"""MCP clients no one here wrote, against a live hub on each store: the Claude Code CLI, the TypeScript SDK, Codex.

The pinned versions live in tests/clients/package.json (bump them on purpose); `make test` installs them
with `npm ci`. A missing install fails here, naming the command, rather than skipping.
"""
from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

import pytest

from tests.helpers import REPO

CLIENTS = REPO / "tests" / "clients"
BIN = CLIENTS / "node_modules" / ".bin"


def need(tool: str) -> Path:
    """Return the path of an installed client, or fail naming the install command."""
    path = BIN / tool
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make test` (or `npm ci --prefix tests/clients`)")
    return path


async def run(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 120) -> tuple[int, str]:
    """Run a client to completion and return its exit code and combined output."""
    proc = await asyncio.create_subprocess_exec(*map(str, argv), cwd=cwd, env=env, stdin=asyncio.subprocess.DEVNULL,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except asyncio.TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"{argv[0]} did not finish within {timeout}s") from None
    return proc.returncode, out.decode(errors="replace")


def client_env(home: Path) -> dict[str, str]:
    """A clean environment for a client: its own HOME, no telemetry, nothing of ours."""
    home.mkdir(parents=True, exist_ok=True)
    return {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "LANG": "C.UTF-8",
            "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1", "NO_COLOR": "1"}


async def test_claude_code_adds_the_hub_and_lists_it_connected_without_hanging_it(any_hub, tmp_path):
    claude = need("claude")
    env = client_env(tmp_path / "home")
    code, out = await run([claude, "mcp", "add", "--transport", "http", "amux", f"{any_hub.url}/mcp",
                           "--header", f"Authorization: Bearer {any_hub.admin_token}"], env, tmp_path)
    assert code == 0, out
    for _ in range(2):  # the second listing is the one that failed while the first had hung the hub
        code, out = await run([claude, "mcp", "list"], env, tmp_path)
        assert "amux" in out and "✔ Connected" in out, out
    assert any_hub.admin_token not in out
    async with __import__("httpx2").AsyncClient(timeout=2) as http:
        assert (await http.get(f"{any_hub.url}/healthz")).status_code == 200


async def test_claude_code_with_a_wrong_token_is_told_it_cannot_connect(hub, tmp_path):
    claude = need("claude")
    env = client_env(tmp_path / "home")
    await run([claude, "mcp", "add", "--transport", "http", "amux", f"{hub.url}/mcp",
               "--header", "Authorization: Bearer amux.nope.nope"], env, tmp_path)
    code, out = await run([claude, "mcp", "list"], env, tmp_path)
    assert "amux" in out and "✔ Connected" not in out, out


async def test_typescript_sdk_initializes_with_every_version_lists_and_calls_tools(any_hub, tmp_path):
    need("claude")  # the same npm install brings the SDK
    await any_hub.start_runner()
    token = await any_hub.token("alice")  # unlabeled: leases are held under the client's own name
    code, out = await run(["node", CLIENTS / "ts_client.mjs", f"{any_hub.url}/mcp", token],
                          client_env(tmp_path / "home"), CLIENTS)
    assert code == 0, out
    report = json.loads(out.strip().splitlines()[-1])
    assert report["errors"] == []
    assert set(report["versions"]) >= {"2025-03-26", "2025-06-18", "2025-11-25"}
    for version, seen in report["versions"].items():
        assert seen["negotiated"] == version and seen["server"] == "amux" and seen["tools"] >= 30
        assert seen["sessionId"].startswith("amx1.")  # the hub tells clients apart (holder labels)
    assert {"profile_list", "task_submit", "task_wait", "rift_task_new", "rift_vm_exec", "schedule_create",
            "session_list", "session_get", "session_send", "instance_steer"} <= set(report["tools"])
    assert any(p["name"] == "scripted" for p in report["calls"]["profile_list"]["profiles"])
    assert report["calls"]["task"]["status"] == "succeeded"
    assert report["calls"]["task"]["result"]["text"] == "hello from typescript"
    assert report["calls"]["lease"]["holder"] == "mcp:ts-sdk"
    assert report["calls"]["exec"]["exit_code"] == 0 and report["calls"]["exec"]["stdout"] == "hi-from-box\n"


async def test_codex_cli_configures_the_hub_with_a_bearer_token_from_the_environment(hub, tmp_path):
    codex = need("codex")
    env = {**client_env(tmp_path / "home"), "AMUX_TOKEN": hub.admin_token}
    code, out = await run([codex, "mcp", "add", "amux", "--url", f"{hub.url}/mcp",
                           "--bearer-token-env-var", "AMUX_TOKEN"], env, tmp_path)
    assert code == 0, out
    code, out = await run([codex, "mcp", "get", "amux"], env, tmp_path)
    assert code == 0 and f"{hub.url}/mcp" in out and "streamable_http" in out and "AMUX_TOKEN" in out, out
    config = (tmp_path / "home" / ".codex" / "config.toml").read_text()
    assert hub.admin_token not in config  # the token stays in the environment, not in the file


async def test_typescript_sdk_oauth_provider_signs_in_and_calls_tools(any_hub, tmp_path):
    """A hosted client that cannot paste a token: the SDK's OAuth flow, approved on the hub's page."""
    need("claude")  # the same npm install brings the SDK
    token = await any_hub.token("alice")
    code, out = await run(["node", CLIENTS / "ts_oauth.mjs", f"{any_hub.url}/mcp", token],
                          client_env(tmp_path / "home"), CLIENTS)
    assert code == 0, out
    report = json.loads(out.strip().splitlines()[-1])
    assert report["errors"] == []
    steps = report["steps"]
    assert {"registered", "redirect", "unauthorized", "tokens", "connected"} <= set(steps), steps
    assert steps.index("unauthorized") < steps.index("tokens") < steps.index("connected"), steps
    assert "connected" in report["steps"] and report["tools"] >= 30 and report["profiles"] >= 4
    assert report["holder"] == "mcp:ts-oauth" and report["hasRefresh"]
    assert set(report["scope"].split()) == {"tasks", "schedules", "leases"}
