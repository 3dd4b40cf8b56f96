"""Principals and API tokens: random, shown once, stored as SHA-256, checked in constant time."""
from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from datetime import timedelta

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from ..clock import Clock, utc
from ..errors import Invalid, NotFound, Unauthorized
from ..ids import new_id
from ..store.db import Database
from ..store.tables import api_tokens, principals

TOKEN_PREFIX = "amux"
MISSING = (
    "missing bearer token: send `Authorization: Bearer <token>`; "
    "create one with `amux token create --principal NAME`"
)
WRONG = "invalid or revoked token: create a new one with `amux token create --principal NAME`"
LAST_USED_GRANULARITY = timedelta(minutes=1)


@dataclass(frozen=True)
class Caller:
    """Who is calling: the token's principal, label and admin flag."""

    principal_id: str
    principal: str
    token_id: str
    label: str | None
    admin: bool


def hash_secret(secret: str) -> str:
    """Return the stored form of a secret."""
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_token(token: str) -> tuple[str, str] | None:
    """Split `amux.<token id>.<secret>`; None when malformed."""
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX or not parts[1] or not parts[2] or len(token) > 512:
        return None
    return parts[1], parts[2]


class AuthService:
    """Create principals and tokens; authenticate bearer tokens.

    Verified tokens are remembered for `cache_s` seconds (keyed by the secret's hash, never the token),
    so a revocation reaches every replica within that time; the database stays the only truth.
    """

    def __init__(self, db: Database, clock: Clock, cache_s: float = 5.0) -> None:
        self.db = db
        self.clock = clock
        self.cache_s = cache_s
        self._verified: dict[str, tuple[float, Caller]] = {}

    async def ensure_principal(self, conn, name: str, kind: str = "user") -> str:  # noqa: ANN001
        """Return the id of principal `name`, creating it."""
        row = (await conn.execute(sa.select(principals.c.id).where(principals.c.name == name))).first()
        if row:
            return row.id
        pid = new_id("pr")
        await conn.execute(principals.insert().values(id=pid, kind=kind, name=name, created_at=self.clock.now()))
        return pid

    async def mint_in(self, conn, principal_id: str, label: str, *, replace: bool = False) -> str:  # noqa: ANN001
        """Mint a token for an existing principal inside the caller's transaction (replace: revoke others with the label)."""
        now = self.clock.now()
        if replace:
            await conn.execute(api_tokens.update().where(api_tokens.c.label == label, api_tokens.c.revoked_at.is_(None))
                               .values(revoked_at=now))
        token_id = new_id("tok")
        secret = secrets.token_urlsafe(32)
        await conn.execute(api_tokens.insert().values(
            id=token_id, principal_id=principal_id, label=label, token_hash=hash_secret(secret), admin=False, created_at=now))
        return f"{TOKEN_PREFIX}.{token_id.split('_', 1)[1]}.{secret}"

    async def create_token(self, principal: str, label: str | None = None, admin: bool = False, kind: str = "user") -> str:
        """Create a token for `principal` (created if new) and return its plaintext, shown once."""
        principal = principal.strip()
        if not principal or len(principal) > 200:
            raise Invalid("principal name must be 1–200 characters, e.g. --principal alice")
        if kind not in ("user", "service", "runtime"):
            raise Invalid("principal kind must be user, service or runtime")
        token_id = new_id("tok")
        secret = secrets.token_urlsafe(32)
        for attempt in (1, 2):  # another replica may create the same principal at the same moment: then use its row
            try:
                async with self.db.write() as conn:
                    pid = await self.ensure_principal(conn, principal, kind)
                    await conn.execute(api_tokens.insert().values(
                        id=token_id, principal_id=pid, label=label or None, token_hash=hash_secret(secret),
                        admin=admin, created_at=self.clock.now(),
                    ))
                break
            except IntegrityError:
                if attempt == 2:
                    raise
        return f"{TOKEN_PREFIX}.{token_id.split('_', 1)[1]}.{secret}"

    async def authenticate(self, header: str | None) -> Caller:
        """Resolve an `Authorization` header (or bare token) to a Caller, or raise Unauthorized."""
        if not header:
            raise Unauthorized(MISSING)
        token = header[7:].strip() if header[:7].lower() == "bearer " else header.strip()
        parsed = parse_token(token)
        if parsed is None:
            raise Unauthorized(WRONG)
        token_id, secret = "tok_" + parsed[0], parsed[1]
        digest = hash_secret(secret)
        hit = self._verified.get(digest)
        if hit is not None and hit[0] > time.monotonic() and hit[1].token_id == token_id:
            return hit[1]
        async with self.db.read() as conn:
            row = (await conn.execute(
                sa.select(api_tokens, principals.c.name)
                .join(principals, principals.c.id == api_tokens.c.principal_id)
                .where(api_tokens.c.id == token_id)
            )).first()
        if row is None or not hmac.compare_digest(row.token_hash, digest) or row.revoked_at is not None:
            raise Unauthorized(WRONG)
        now = self.clock.now()
        last = utc(row.last_used_at)
        if last is None or now - last >= LAST_USED_GRANULARITY:
            async with self.db.write() as conn:
                await conn.execute(api_tokens.update().where(api_tokens.c.id == token_id).values(last_used_at=now))
        caller = Caller(row.principal_id, row.name, token_id, row.label, bool(row.admin))
        if len(self._verified) > 10_000:
            self._verified.clear()
        self._verified[digest] = (time.monotonic() + self.cache_s, caller)
        return caller

    async def claim_label(self, caller: Caller, client_name: str) -> str | None:
        """Label an unlabeled token `mcp:<client name>`; the first client wins, an explicit label is kept."""
        name = "".join(ch for ch in client_name.strip() if ch.isprintable())[:120]
        if caller.label or not name:
            return caller.label
        async with self.db.write() as conn:
            await conn.execute(
                api_tokens.update()
                .where(api_tokens.c.id == caller.token_id, api_tokens.c.label.is_(None))
                .values(label=f"mcp:{name}")
            )
            row = (await conn.execute(sa.select(api_tokens.c.label).where(api_tokens.c.id == caller.token_id))).first()
        self._forget(caller.token_id)
        return row.label if row else None

    def _forget(self, token_id: str) -> None:
        for digest, (_, cached) in list(self._verified.items()):
            if cached.token_id == token_id:
                self._verified.pop(digest, None)

    async def token_label(self, token_id: str) -> str | None:
        """Return a token's current label."""
        async with self.db.read() as conn:
            row = (await conn.execute(sa.select(api_tokens.c.label).where(api_tokens.c.id == token_id))).first()
        if row is None:
            raise NotFound(f"token {token_id} does not exist")
        return row.label
