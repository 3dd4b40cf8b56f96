"""Identity bindings (a Feishu identity → a principal), one-time link codes, and the bot's inbound dedup keys."""
from __future__ import annotations

from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from ..domain.states import BindingStatus
from .db import Connection, Database, Row
from .tables import identity_bindings, identity_link_codes, principals


class SqlIdentityStore:
    """Bindings are unique per (app_id, open_id) and are revoked, never deleted; link codes are stored by hash."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # --- bindings --------------------------------------------------------------------------------

    async def binding(self, conn: Connection, app_id: str, open_id: str, *, lock: bool = False) -> Row | None:
        """Return the binding of (app_id, open_id), active or revoked; `lock` holds it for this transaction."""
        stmt = sa.select(identity_bindings).where(identity_bindings.c.app_id == app_id,
                                                  identity_bindings.c.open_id == open_id)
        return (await conn.execute(self.db.for_update(stmt) if lock else stmt)).first()

    async def active_binding(self, conn: Connection, app_id: str, open_id: str) -> Row | None:
        """Return the binding of (app_id, open_id) only while it is active."""
        return (await conn.execute(sa.select(identity_bindings).where(
            identity_bindings.c.app_id == app_id, identity_bindings.c.open_id == open_id,
            identity_bindings.c.status == BindingStatus.ACTIVE))).first()

    async def binding_by_id(self, conn: Connection, binding_id: str, *, lock: bool = False) -> Row | None:
        """Return one binding by id; `lock` holds it for this transaction."""
        stmt = sa.select(identity_bindings).where(identity_bindings.c.id == binding_id)
        return (await conn.execute(self.db.for_update(stmt) if lock else stmt)).first()

    async def sole_principal_of_union(self, conn: Connection, union_id: str) -> str | None:
        """Return the principal every active binding with this union_id names, when they all name one; else None
        (the same person through another application of the tenant is one principal)."""
        same = set((await conn.execute(sa.select(identity_bindings.c.principal_id).where(
            identity_bindings.c.union_id == union_id,
            identity_bindings.c.status == BindingStatus.ACTIVE))).scalars().all())
        return same.pop() if len(same) == 1 else None

    async def add_binding(self, conn: Connection, *, binding_id: str, principal_id: str, app_id: str, open_id: str,
                          union_id: str | None, user_id: str | None, now: datetime) -> bool:
        """Insert an active binding for an identity that has none; False when another transaction bound that
        identity first (read it with `binding`): this transaction stays usable."""
        try:
            async with conn.begin_nested():
                await conn.execute(identity_bindings.insert().values(
                    id=binding_id, principal_id=principal_id, app_id=app_id, open_id=open_id,
                    union_id=union_id or None, user_id=user_id or None, status=BindingStatus.ACTIVE, created_at=now))
        except IntegrityError:
            return False
        return True

    async def fill_ids(self, conn: Connection, binding: Row, union_id: str | None, user_id: str | None) -> None:
        """Fill the union_id / user_id a binding lacks; ids it knows already never change."""
        fill = {k: v for k, v in (("union_id", union_id), ("user_id", user_id)) if v and not getattr(binding, k)}
        if fill:
            await conn.execute(identity_bindings.update().where(identity_bindings.c.id == binding.id).values(**fill))

    async def point_binding(self, conn: Connection, binding: Row, principal_id: str, union_id: str | None,
                            user_id: str | None) -> None:
        """Make a binding name `principal_id` and be active again; union_id / user_id are filled only where
        missing."""
        fill = {k: v for k, v in (("union_id", union_id), ("user_id", user_id)) if v and not getattr(binding, k)}
        await conn.execute(identity_bindings.update().where(identity_bindings.c.id == binding.id).values(
            principal_id=principal_id, status=BindingStatus.ACTIVE, **fill))

    async def revoke_binding(self, conn: Connection, binding_id: str) -> None:
        """Mark a binding revoked (idempotent); the row stays, so the identity may link again."""
        await conn.execute(identity_bindings.update().where(identity_bindings.c.id == binding_id)
                           .values(status=BindingStatus.REVOKED))

    async def list_bindings(self, conn: Connection, principal_id: str | None) -> list[Row]:
        """List bindings with their `principal_name`, oldest first: one principal's, or everyone's for None."""
        stmt = (sa.select(identity_bindings, principals.c.name.label("principal_name"))
                .outerjoin(principals, principals.c.id == identity_bindings.c.principal_id)
                .order_by(identity_bindings.c.created_at, identity_bindings.c.id))
        if principal_id is not None:
            stmt = stmt.where(identity_bindings.c.principal_id == principal_id)
        return list((await conn.execute(stmt)).all())

    # --- link codes ------------------------------------------------------------------------------

    async def add_link_code(self, conn: Connection, *, code_id: str, principal_id: str, code_hash: str,
                            now: datetime, expires_at: datetime) -> None:
        """Store a new link code for a principal by its hash, unused, expiring at `expires_at`."""
        await conn.execute(identity_link_codes.insert().values(
            id=code_id, principal_id=principal_id, code_hash=code_hash, created_at=now, expires_at=expires_at))

    async def link_code_to_redeem(self, conn: Connection, code_hash: str) -> Row | None:
        """Return the link code with this hash, locked for this transaction so it is spent once."""
        return (await conn.execute(self.db.for_update(sa.select(identity_link_codes).where(
            identity_link_codes.c.code_hash == code_hash)))).first()

    async def spend_link_code(self, conn: Connection, code_id: str, binding_id: str, now: datetime) -> None:
        """Mark a link code used, remembering the binding it made."""
        await conn.execute(identity_link_codes.update().where(identity_link_codes.c.id == code_id)
                           .values(used_at=now, binding_id=binding_id))
