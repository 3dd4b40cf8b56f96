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

from ...clock import Clock, iso, utc
from ...domain.states import BindingStatus
from ...errors import Forbidden, Invalid, NotFound
from ...ids import new_id
from ...store.db import Connection, Database, Row
from ...store.identities import SqlIdentityStore
from ...store.schedules import SqlScheduleStore
from ...store.tokens import SqlTokenStore
from .service import Caller

CODE_TTL_S = 600
INBOUND_TTL = timedelta(days=2)  # Feishu retries an event for a few hours at most
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



def binding_view(row: Row, principal_name: str | None = None) -> dict:
    """Return one identity binding as the CLI and REST show it."""
    return {"binding_id": row.id, "principal_id": row.principal_id, "principal": principal_name,
            "app_id": row.app_id, "open_id": row.open_id, "union_id": row.union_id, "user_id": row.user_id,
            "status": row.status, "created_at": iso(row.created_at)}


@dataclass(frozen=True)
class Linked:
    """The outcome of redeeming a code: the binding, its principal, and whether it changed anything."""

    binding_id: str
    principal_id: str
    principal: str
    changed: bool


@dataclass(frozen=True)
class Contact:
    """A Feishu identity's active binding and the principal it acts as."""

    binding_id: str
    principal_id: str
    name: str


class IdentityService:
    """Mint and redeem link codes; list and unlink identity bindings; bind a Feishu identity on first contact."""

    def __init__(self, db: Database, clock: Clock, ttl_s: float = CODE_TTL_S) -> None:
        self.db = db
        self.clock = clock
        self.ttl_s = ttl_s
        self.store = SqlIdentityStore(db)
        self.principals = SqlTokenStore(db)
        self.schedules = SqlScheduleStore(db)

    async def set_execution_access(self, caller: Caller, principal: str, *, revoked: bool) -> dict:
        """Revoke or restore a principal's execution access (admin): while revoked, its Feishu personal schedule
        views and card actions show nothing (the seed's "execution access"); operator/CLI access is unchanged."""
        if not caller.admin:
            raise Forbidden("changing a principal's execution access needs an admin token (amux token create --admin)")
        now = self.clock.now()
        async with self.db.write() as conn:
            pid = await self.principals.principal_id(conn, principal)
            if pid is None:
                raise NotFound(f"principal {principal!r} does not exist; `amux token list --all` names every one")
            await self.schedules.set_execution_revoked(conn, pid, now if revoked else None)
        return {"principal": principal, "principal_id": pid, "execution_access": not revoked,
                "revoked_at": iso(now) if revoked else None}

    async def create_link_code(self, caller: Caller) -> dict:
        """Mint a one-time code for the caller's principal (valid `ttl_s`); only its hash is stored."""
        if caller.kind in ("runner", "run"):
            raise Forbidden("a runner or task-run token cannot link a Feishu identity; use your own token "
                            "(`amux token create --principal NAME`)")
        now = self.clock.now()
        code = "".join(secrets.choice(ALPHABET) for _ in range(CODE_LEN))
        async with self.db.write() as conn:
            await self.store.add_link_code(conn, code_id=new_id("ilc"), principal_id=caller.principal_id,
                                           code_hash=code_hash(code), now=now,
                                           expires_at=now + timedelta(seconds=self.ttl_s))
        shown = "-".join(code[i:i + 4] for i in range(0, CODE_LEN, 4))
        return {"code": shown, "principal": caller.principal, "expires_at": iso(now + timedelta(seconds=self.ttl_s)),
                "valid_s": int(self.ttl_s), "how": f"send `/amux link {shown}` to the amux bot in Feishu"}

    async def redeem(self, code: str | None, app_id: str, open_id: str, union_id: str | None = None,
                     user_id: str | None = None) -> Linked:
        """Bind (app_id, open_id) to the code's principal and spend the code; raise LinkRefused naming the fix."""
        if not code or not code.strip():
            raise LinkRefused("missing", "no link code: run `amux identity link` and send `/amux link CODE` "
                                         "with the code it prints")
        norm = normalize(code)
        if norm is None:
            raise LinkRefused("malformed",
                              "that is not a link code: run `amux identity link` and send the code it prints")
        now = self.clock.now()
        async with self.db.write() as conn:
            return await self._redeem(conn, norm, app_id, open_id, union_id, user_id, now)

    async def _redeem(self, conn: Connection, norm: str, app_id: str, open_id: str, union_id: str | None,
                      user_id: str | None, now: datetime) -> Linked:
        row = await self.store.link_code_to_redeem(conn, code_hash(norm))
        if row is None:
            raise LinkRefused("unknown",
                              "this link code is not known; check it, or run `amux identity link` for a new one")
        if row.used_at is not None:
            raise LinkRefused("used", "this link code was already used; run `amux identity link` for a new one")
        if utc(row.expires_at) <= now:
            raise LinkRefused("expired",
                              "this link code expired (codes last 10 minutes); run `amux identity link` again")
        name = await self.principals.principal_name(conn, row.principal_id)
        if name is None:
            raise LinkRefused("principal_gone", "the account this code was made for no longer exists; "
                                                "run `amux identity link` with your current token")
        binding = await self.store.binding(conn, app_id, open_id, lock=True)
        bid = new_id("ib")
        if binding is None and not await self.store.add_binding(
                conn, binding_id=bid, principal_id=row.principal_id, app_id=app_id, open_id=open_id,
                union_id=union_id, user_id=user_id, now=now):
            # A concurrent first contact bound the identity between our read and insert: move its binding.
            binding = await self.store.binding(conn, app_id, open_id, lock=True)
        changed = True
        if binding is not None:
            bid = binding.id
            changed = binding.principal_id != row.principal_id or binding.status != BindingStatus.ACTIVE
            await self.store.point_binding(conn, binding, row.principal_id, union_id, user_id)
        await self.store.spend_link_code(conn, row.id, bid, now)
        return Linked(bid, row.principal_id, name, changed)

    async def list(self, caller: Caller, all_principals: bool = False) -> list[dict]:
        """Return the caller's bindings (active and revoked); an admin may ask for everyone's."""
        if all_principals and not caller.admin:
            raise Forbidden("listing every identity needs an admin token; drop --all to see your own")
        async with self.db.read() as conn:
            rows = await self.store.list_bindings(conn, None if all_principals else caller.principal_id)
        return [binding_view(r, r.principal_name) for r in rows]

    async def unlink(self, caller: Caller, binding_id: str) -> dict:
        """Revoke one of the caller's bindings (an admin: anyone's); idempotent. The identity may link again."""
        async with self.db.write() as conn:
            row = await self.store.binding_by_id(conn, binding_id, lock=True)
            if row is None or (row.principal_id != caller.principal_id and not caller.admin):
                raise NotFound(f"identity binding {binding_id!r} does not exist or is not yours; "
                               "list yours with `amux identity list`")
            await self.store.revoke_binding(conn, binding_id)
            row = await self.store.binding_by_id(conn, binding_id) or row
            name = await self.principals.principal_name(conn, row.principal_id)
        return binding_view(row, name)

    # ------------------------------------------------------------ first contact through the bot

    async def contact(self, app_id: str, open_id: str, union_id: str | None = None,
                      user_id: str | None = None) -> Contact | None:
        """Return the active binding of a Feishu identity, creating principal and binding on first contact; None
        when its binding is revoked (a revoked identity gets no answer until it links again)."""
        now = self.clock.now()
        return await self.db.transaction(lambda conn: self._contact_in(conn, app_id, open_id, union_id, user_id, now))

    async def _contact_in(self, conn: Connection, app_id: str, open_id: str, union_id: str | None,
                          user_id: str | None, now: datetime) -> Contact | None:
        """`contact`'s transaction."""
        row = await self.store.binding(conn, app_id, open_id)
        if row is None:
            principal_id = await self.store.sole_principal_of_union(conn, union_id) if union_id else None
            if principal_id is None:
                principal_id = await self.principals.ensure_principal(
                    conn, f"feishu:{app_id}:{open_id}", "user", now, new_id("pr"))
            bid = new_id("ib")
            if await self.store.add_binding(conn, binding_id=bid, principal_id=principal_id, app_id=app_id,
                                            open_id=open_id, union_id=union_id, user_id=user_id, now=now):
                return await self._contact(conn, bid, principal_id)
            row = await self.store.binding(conn, app_id, open_id)  # a concurrent first contact bound it first
            if row is None:
                return None
        if row.status != BindingStatus.ACTIVE:
            return None
        await self.store.fill_ids(conn, row, union_id, user_id)
        return await self._contact(conn, row.id, row.principal_id)

    async def find_contact(self, app_id: str, open_id: str) -> Contact | None:
        """Return the active binding of a Feishu identity, or None (never creates one)."""
        async with self.db.read() as conn:
            row = await self.store.active_binding(conn, app_id, open_id)
            if row is None:
                return None
            return await self._contact(conn, row.id, row.principal_id)

    async def _contact(self, conn: Connection, binding_id: str, principal_id: str) -> Contact:
        name = await self.principals.principal_name(conn, principal_id)
        return Contact(binding_id, principal_id, name or principal_id)
