"""Boxes page sign-in sessions: a revocable session id in the cookie instead of the API token."""
from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import timedelta

from ...clock import Clock, utc
from ...ids import short_id
from ...store.db import Database
from ...store.leases import SqlLeaseStore
from ...store.ports.leases import LeaseStore
from ..auth.service import Caller

SESSION_TTL_S = 12 * 3600
_COOKIE = re.compile(r"(bxs_[0-9a-z]{1,40})\.([A-Za-z0-9_-]{20,128})")


def _hash(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class BoxSessionService:
    """Open, resolve and revoke Boxes page sessions.

    Rules: the cookie value is `<session id>.<secret>` and only the secret's SHA-256 is stored; a session
    resolves only before `expires_at`, while not revoked, and while the API token that opened it is not
    revoked. Revoking is idempotent.
    """

    def __init__(self, db: Database, clock: Clock, ttl_s: float = SESSION_TTL_S) -> None:
        self.db = db
        self.clock = clock
        self.ttl_s = ttl_s
        self.store: LeaseStore = SqlLeaseStore(db)

    async def open(self, caller: Caller) -> str | None:
        """Open a session for a caller that signed in with a user or admin token; return the cookie value (shown
        once), or None for tokens that may not sign in to pages (runner and per-run tokens)."""
        if caller.kind not in ("user", "admin"):
            return None
        now, sid, secret = self.clock.now(), short_id("bxs", 16), secrets.token_urlsafe(32)
        async with self.db.write() as conn:
            await self.store.open_box_session(conn, session_id=sid, principal_id=caller.principal_id,
                                              token_id=caller.token_id, session_hash=_hash(secret), now=now,
                                              expires_at=now + timedelta(seconds=self.ttl_s))
        return f"{sid}.{secret}"

    async def resolve(self, cookie: str | None) -> Caller | None:
        """Return who a cookie's session signs in, or None when it is malformed, unknown, expired or revoked."""
        m = _COOKIE.fullmatch((cookie or "").strip())
        if not m:
            return None
        async with self.db.read() as conn:  # one statement, on every page load
            row = await self.store.box_session(conn, m.group(1))
        if (row is None or not hmac.compare_digest(row.session_hash, _hash(m.group(2)))
                or row.revoked_at is not None or row.token_revoked_at is not None
                or utc(row.expires_at) <= self.clock.now() or row.kind not in ("user", "admin")):
            return None
        return Caller(row.principal_id, row.name, row.token_id, row.label, bool(row.admin) and row.kind == "admin",
                      kind=row.kind)

    async def revoke(self, cookie: str | None) -> bool:
        """End the session a cookie names (sign out); return whether one was ended."""
        m = _COOKIE.fullmatch((cookie or "").strip())
        if not m:
            return False
        async with self.db.write() as conn:
            return await self.store.revoke_box_session(conn, m.group(1), _hash(m.group(2)), self.clock.now())
