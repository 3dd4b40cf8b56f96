"""What a fake CLI does when it acts like a real agent with the MCP servers it was launched with.

A real Claude Code reads `--mcp-config FILE` (`{"mcpServers": {NAME: {"type": "http", "url", "headers"}}}`);
a real Codex reads `-c mcp_servers.NAME.url=…` and `-c mcp_servers.NAME.bearer_token_env_var=VAR` and takes
the bearer token from that variable. Either way the agent then speaks MCP over Streamable HTTP: here with
the official `mcp` SDK client, exactly as tests/helpers.py connects to the hub.

The stage direction `{"_fake": "mcp_calls", "calls": [{"tool": T, "args": {…}}, …]}` makes the fake call
each tool in order; what came back is recorded in $FAKE_RECORD_DIR/delegations.json and returned, so the
fake can print it as the agent's answer. Pi has no MCP client: its fake runs the `amux` CLI on its PATH
instead (`{"_fake": "cli_calls", "calls": [{"tool": T, "argv": [...]}, …]}`), as a Pi agent would in bash.
"""
from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import fakecli


def claude_servers(argv: list[str]) -> dict[str, dict]:
    """Return the MCP servers of every `--mcp-config` file; refuse a config file others could read."""
    servers: dict[str, dict] = {}
    for i, arg in enumerate(argv):
        if arg == "--mcp-config" and i + 1 < len(argv):
            path = Path(argv[i + 1])
            mode = stat.S_IMODE(path.stat().st_mode)
            if mode & 0o077:
                sys.stderr.write(f"fake: MCP config {path} has mode {oct(mode)}; it holds a token\n")
                sys.exit(1)
            fakecli.record("mcp_config.json",
                           {"path": str(path), "mode": oct(mode), "config": json.loads(path.read_text())})
            servers.update(json.loads(path.read_text()).get("mcpServers") or {})
    return servers


def codex_servers(argv: list[str]) -> dict[str, dict]:
    """Return the MCP servers `-c mcp_servers.NAME.KEY=VALUE` overrides declare (values parsed as TOML)."""
    servers: dict[str, dict] = {}
    for i, arg in enumerate(argv):
        if arg in ("-c", "--config") and i + 1 < len(argv) and argv[i + 1].startswith("mcp_servers."):
            key, _, raw = argv[i + 1].partition("=")
            _, name, field = key.split(".", 2)
            servers.setdefault(name, {})[field] = tomllib.loads(f"v = {raw}")["v"]
    fakecli.record("mcp_config.json", {"config": servers})
    out = {}
    for name, cfg in servers.items():
        headers = {}
        if cfg.get("bearer_token_env_var"):
            token = os.environ.get(cfg["bearer_token_env_var"])
            if not token:
                sys.stderr.write(f"fake: MCP server {name}: {cfg['bearer_token_env_var']} is not set\n")
                sys.exit(1)
            headers["Authorization"] = f"Bearer {token}"
        out[name] = {"type": "http", "url": cfg["url"], "headers": headers}
    return out


async def _call(server: dict, calls: list[dict], client_name: str) -> list[dict[str, Any]]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client
    from mcp.types import Implementation

    results = []
    async with httpx2.AsyncClient(headers=server.get("headers") or {}, timeout=30) as http, \
            Client(streamable_http_client(server["url"], http_client=http),
                   client_info=Implementation(name=client_name, version="1.0")) as client:
        for call in calls:
            res = await client.call_tool(call["tool"], call.get("args") or {})
            text = " ".join(getattr(c, "text", "") for c in res.content or [])
            results.append({"tool": call["tool"], "is_error": bool(res.is_error),
                            "result": res.structured_content, "text": text})
    return results


def mcp_calls(servers: dict[str, dict], directive: dict, client_name: str) -> list[dict[str, Any]]:
    """Call the directive's tools on its server (default `amux`); record and return what came back."""
    name = directive.get("server", "amux")
    if name not in servers:
        sys.stderr.write(f"fake: no MCP server {name!r} was configured (have {sorted(servers)})\n")
        sys.exit(1)
    results = asyncio.run(_call(servers[name], directive["calls"], client_name))
    fakecli.record("delegations.json", [{**r, "via": "mcp"} for r in results])
    return results


def cli_calls(directive: dict) -> list[dict[str, Any]]:
    """Run `amux ARGV --json` for each call with this process's environment (AMUX_HUB_URL, AMUX_TOKEN)."""
    amux = shutil.which("amux")
    if amux is None:
        sys.stderr.write("fake: the amux CLI is not on PATH\n")
        sys.exit(1)
    results = []
    for call in directive["calls"]:
        done = subprocess.run([amux, *call["argv"], "--json"], capture_output=True, text=True, timeout=60)
        try:
            result = json.loads(done.stdout) if done.returncode == 0 else None
        except ValueError:
            result = None
        results.append({"tool": call["tool"], "is_error": done.returncode != 0, "result": result,
                        "text": done.stderr.strip() or done.stdout.strip(), "via": "cli"})
    fakecli.record("delegations.json", results)
    return results


def summary(results: list[dict[str, Any]]) -> str:
    """Return the agent's answer: one line per call naming the id it got, or the refusal."""
    lines = []
    for r in results:
        got = r["result"] or {}
        ident = got.get("task_id") or got.get("schedule_id") if isinstance(got, dict) else None
        lines.append(f"{r['tool']}: {'refused: ' + r['text'] if r['is_error'] else ident}")
    return "\n".join(lines)
