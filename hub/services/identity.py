"""Identity links: bind a Feishu identity to an existing principal with a one-time code (DESIGN §7).

`amux identity link` (any principal, over REST) mints a code valid for 10 minutes, stored hashed; the person
sends `/amux link CODE` to the bot, which redeems it for the sender's (app_id, open_id): that identity's binding
now names the code's principal (created, moved from the principal its first contact made, or re-activated
after an unlink). A code works once. Schedules keep their frozen creator: linking never re-attributes history.
"""
from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from ..clock import Clock, utc
from ..errors import Forbidden, Invalid, NotFound
from ..ids import new_id
from ..store.db import Database
from ..store.tables import identity_bindings, identity_link_codes, principals
from .auth import Caller

CODE_TTL_S = 600
ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"   # no 0/O, 1/I: read aloud or retyped from a terminal
CODE_LEN = 12


class LinkRefused(Invalid):
    """A link code cannot be used; `reason` names which of the cases in REASONS it is."""

    REASONS = ("missing", "malformed", "unknown", "expired", "used", "principal_gone")

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


def normalize(code: str) -> str | None:
    """Return the code without separators, upper-cased; None when it cannot be a code at all."""
    text = "".join(ch for ch in (code or "").upper() if ch not in "- ")
    if len(text) != CODE_LEN or any(ch not in ALPHABET for ch in text):
        return None
    return text


def code_hash(code: str) -> str:
    """Return the stored form of a normalized code."""
    return hashlib.sha256(f"amux-link:{code}".encode()).hexdigest()


def _iso(dt: datetime | None) -> str | None:
    dt = utc(dt)
    return dt.isoformat() if dt else None


def binding_view(row: Any, principal_name: str | None = None) -> dict:
    """Return one identity binding as the CLI and REST show it."""
    return {"binding_id": row.id, "principal_id": row.principal_id, "principal": principal_name,
            "app_id": row.app_id, "open_id": row.open_id, "union_id": row.union_id, "user_id": row.user_id,
            "status": row.status, "created_at": _iso(row.created_at)}


@dataclass(frozen=True)
class Linked:
    """The outcome of redeeming a code: the binding, its principal, and whether it changed anything."""

    binding_id: str
    principal_id: str
    principal: str
    changed: bool


class IdentityService:
    """Mint and redeem link codes; list and unlink identity bindings."""

    def __init__(self, db: Database, clock: Clock, ttl_s: float = CODE_TTL_S) -> None:
        self.db = db
        self.clock = clock
        self.ttl_s = ttl_s

    async def create_link_code(self, caller: Caller) -> dict:
        """Mint a one-time code for the caller's principal (valid `ttl_s`); only its hash is stored."""
        if caller.kind in ("runner", "run"):
            raise Forbidden("a runner or task-run token cannot link a Feishu identity; use your own token "
                            "(`amux token create --principal NAME`)")
        now = self.clock.now()
        code = "".join(secrets.choice(ALPHABET) for _ in range(CODE_LEN))
        async with self.db.write() as conn:
            await conn.execute(identity_link_codes.insert().values(
                id=new_id("ilc"), principal_id=caller.principal_id, code_hash=code_hash(code), created_at=now,
                expires_at=now + timedelta(seconds=self.ttl_s)))
        shown = "-".join(code[i:i + 4] for i in range(0, CODE_LEN, 4))
        return {"code": shown, "principal": caller.principal, "expires_at": _iso(now + timedelta(seconds=self.ttl_s)),
                "valid_s": int(self.ttl_s), "how": f"send `/amux link {shown}` to the amux bot in Feishu"}

    async def redeem(self, code: str | None, app_id: str, open_id: str, union_id: str | None = None,
                     user_id: str | None = None) -> Linked:
        """Bind (app_id, open_id) to the code's principal and spend the code; raise LinkRefused naming the fix."""
        if not code or not code.strip():
            raise LinkRefused("missing", "no link code: run `amux identity link` and send `/amux link CODE` with the code it prints")
        norm = normalize(code)
        if norm is None:
            raise LinkRefused("malformed", "that is not a link code: run `amux identity link` and send the code it prints")
        now = self.clock.now()
        for _ in range(2):  # a concurrent first contact may insert the binding row between our read and insert
            try:
                async with self.db.write() as conn:
                    return await self._redeem(conn, norm, app_id, open_id, union_id, user_id, now)
            except IntegrityError:
                continue
        raise LinkRefused("used", "this link code was just used; run `amux identity link` for a new one")

    async def _redeem(self, conn, norm: str, app_id: str, open_id: str, union_id: str | None,  # noqa: ANN001
                      user_id: str | None, now: datetime) -> Linked:
        row = (await conn.execute(self.db.for_update(sa.select(identity_link_codes).where(
            identity_link_codes.c.code_hash == code_hash(norm))))).first()
        if row is None:
            raise LinkRefused("unknown", "this link code is not known; check it, or run `amux identity link` for a new one")
        if row.used_at is not None:
            raise LinkRefused("used", "this link code was already used; run `amux identity link` for a new one")
        if utc(row.expires_at) <= now:
            raise LinkRefused("expired", "this link code expired (codes last 10 minutes); run `amux identity link` again")
        name = (await conn.execute(sa.select(principals.c.name).where(principals.c.id == row.principal_id))).scalar()
        if name is None:
            raise LinkRefused("principal_gone", "the account this code was made for no longer exists; "
                                                "run `amux identity link` with your current token")
        binding = (await conn.execute(self.db.for_update(sa.select(identity_bindings).where(
            identity_bindings.c.app_id == app_id, identity_bindings.c.open_id == open_id)))).first()
        changed = True
        fill = {k: v for k, v in (("union_id", union_id), ("user_id", user_id)) if v}
        if binding is None:
            bid = new_id("ib")
            await conn.execute(identity_bindings.insert().values(
                id=bid, principal_id=row.principal_id, app_id=app_id, open_id=open_id, union_id=union_id or None,
                user_id=user_id or None, status="active", created_at=now))
        else:
            bid = binding.id
            changed = binding.principal_id != row.principal_id or binding.status != "active"
            await conn.execute(identity_bindings.update().where(identity_bindings.c.id == bid).values(
                principal_id=row.principal_id, status="active",
                **{k: v for k, v in fill.items() if not getattr(binding, k)}))
        await conn.execute(identity_link_codes.update().where(identity_link_codes.c.id == row.id)
                           .values(used_at=now, binding_id=bid))
        return Linked(bid, row.principal_id, name, changed)

    async def list(self, caller: Caller, all_principals: bool = False) -> list[dict]:
        """Return the caller's bindings (active and revoked); an admin may ask for everyone's."""
        if all_principals and not caller.admin:
            raise Forbidden("listing every identity needs an admin token; drop --all to see your own")
        stmt = (sa.select(identity_bindings, principals.c.name.label("principal_name"))
                .outerjoin(principals, principals.c.id == identity_bindings.c.principal_id)
                .order_by(identity_bindings.c.created_at, identity_bindings.c.id))
        if not all_principals:
            stmt = stmt.where(identity_bindings.c.principal_id == caller.principal_id)
        async with self.db.read() as conn:
            rows = (await conn.execute(stmt)).all()
        return [binding_view(r, r.principal_name) for r in rows]

    async def unlink(self, caller: Caller, binding_id: str) -> dict:
        """Revoke one of the caller's bindings (an admin: anyone's); idempotent. The identity may link again."""
        async with self.db.write() as conn:
            row = (await conn.execute(self.db.for_update(sa.select(identity_bindings).where(
                identity_bindings.c.id == binding_id)))).first()
            if row is None or (row.principal_id != caller.principal_id and not caller.admin):
                raise NotFound(f"identity binding {binding_id!r} does not exist or is not yours; "
                               "list yours with `amux identity list`")
            await conn.execute(identity_bindings.update().where(identity_bindings.c.id == binding_id)
                               .values(status="revoked"))
            row = (await conn.execute(sa.select(identity_bindings).where(identity_bindings.c.id == binding_id))).first()
            name = (await conn.execute(sa.select(principals.c.name).where(principals.c.id == row.principal_id))).scalar()
        return binding_view(row, name)
