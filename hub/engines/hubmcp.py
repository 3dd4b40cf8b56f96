"""The hub's MCP endpoint as a Session Turn's agent is given it; task children get none.

A Session Turn's child has AMUX_SESSION_ID, AMUX_HUB_URL and its run token AMUX_TOKEN (labelled
`amux-session:<id>`) in its environment. Each adapter turns that into its CLI's own MCP
configuration, so the agent can delegate Tasks and create schedules that the hub correlates to the
exact Turn. A task child (no AMUX_SESSION_ID) gets the `amux` CLI for memory, never task MCP tools.

- Claude Code: `--mcp-config FILE`, FILE a JSON `{"mcpServers": {"amux": {"type": "http", "url": …,
  "headers": {"Authorization": "Bearer …"}}}}` written 0600 in the run's private HOME (never argv,
  never the workspace) and removed when the run ends.
- Codex: `-c mcp_servers.amux.url="…/mcp" -c mcp_servers.amux.bearer_token_env_var="AMUX_TOKEN"`
  (a streamable-HTTP server whose bearer token Codex reads from the child's environment).
- Pi: no MCP client at all, by design (its README: "No MCP. Build CLI tools with READMEs"); a Pi
  Turn reaches the hub through the `amux` CLI on its PATH (`amux task submit`, `amux schedule create`),
  which reads the same AMUX_HUB_URL and AMUX_TOKEN.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, Mapping

SERVER = "amux"
TOKEN_VAR = "AMUX_TOKEN"


@dataclass(frozen=True)
class HubEndpoint:
    """Where a Turn's agent reaches the hub over MCP, and the token it presents."""

    url: str
    token: str


def session_endpoint(env: Mapping[str, str]) -> HubEndpoint | None:
    """Return the hub's MCP endpoint for a Session Turn's child, or None for a task child (no AMUX_SESSION_ID)."""
    hub, token = env.get("AMUX_HUB_URL"), env.get(TOKEN_VAR)
    if not env.get("AMUX_SESSION_ID") or not hub or not token:
        return None
    return HubEndpoint(url=f"{hub.rstrip('/')}/mcp", token=token)


def claude_config(endpoint: HubEndpoint) -> dict:
    """Return Claude Code's `--mcp-config` document: one Streamable HTTP server with its bearer header."""
    return {"mcpServers": {SERVER: {"type": "http", "url": endpoint.url,
                                    "headers": {"Authorization": f"Bearer {endpoint.token}"}}}}


def codex_overrides(endpoint: HubEndpoint) -> list[str]:
    """Return Codex `-c` overrides that add the hub as a streamable-HTTP server; the token stays in the env."""
    return ["-c", f"mcp_servers.{SERVER}.url={json.dumps(endpoint.url)}",
            "-c", f"mcp_servers.{SERVER}.bearer_token_env_var={json.dumps(TOKEN_VAR)}"]


@contextlib.contextmanager
def private_file(env: Mapping[str, str], name: str, content: str) -> Iterator[Path]:
    """Write `content` to a 0600 file in the run's private HOME (a fresh 0700 folder without one); remove it after.

    The file is created exclusively with its mode from the first byte, so no other user ever sees it.
    """
    home = env.get("HOME")
    if home and os.path.isdir(home):
        folder, own = Path(home), False
    else:
        folder, own = Path(tempfile.mkdtemp(prefix="amux-run-")), True
    path = folder / name
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a stale copy from a crashed run: never written through
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(content)
        yield path
    finally:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        if own:
            shutil.rmtree(folder, ignore_errors=True)
