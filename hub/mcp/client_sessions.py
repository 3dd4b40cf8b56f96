"""`Mcp-Session-Id` values that tell apart the clients sharing one token, on every replica, without server state.

A token names a user, not a conversation; several MCP clients (Claude Code, Codex, a script) may share it.
At `initialize` the hub answers with an `Mcp-Session-Id` carrying the client's declared name, bound to the
token and signed with a key every replica reads from the database; clients send it back on every request
(the Streamable HTTP transport requires them to), so each request knows which client made it.
"""
from __future__ import annotations

import base64
import dataclasses
import hashlib
import hmac
import json

from ..services.auth.service import Caller

PREFIX = "amx1"
MAX_NAME = 120


def clean_name(name: str) -> str:
    """Keep a declared client name printable and short enough for a holder label."""
    return "".join(ch for ch in name.strip() if ch.isprintable())[:MAX_NAME]


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class ClientSessions:
    """Issue and read signed client-session ids (visible ASCII, as the transport requires)."""

    def __init__(self, key: bytes) -> None:
        self._key = key

    def _sign(self, payload: str) -> str:
        return _b64(hmac.new(self._key, payload.encode("ascii"), hashlib.sha256).digest()[:18])

    def issue(self, token_id: str, client_name: str) -> str:
        """Return a session id naming `client_name` that only requests with token `token_id` can use."""
        payload = _b64(json.dumps([token_id, clean_name(client_name)], ensure_ascii=False).encode())
        return f"{PREFIX}.{payload}.{self._sign(payload)}"

    def client_of(self, session_id: str | None, token_id: str) -> str | None:
        """Return the client name a session id carries, or None when it is absent, forged or another token's."""
        if not session_id or len(session_id) > 1024 or not session_id.isascii():
            return None
        parts = session_id.split(".")
        if len(parts) != 3 or parts[0] != PREFIX or not hmac.compare_digest(parts[2], self._sign(parts[1])):
            return None
        try:
            bound, name = json.loads(_unb64(parts[1]))
        except (ValueError, TypeError):
            return None
        return name if bound == token_id and isinstance(name, str) and name else None


def labeled(caller: Caller, client: str | None) -> Caller:
    """Name the caller after its client (`mcp:<name>`) unless its token carries an explicit label."""
    if caller.label or not client:
        return caller
    return dataclasses.replace(caller, label=f"mcp:{client}")
