"""Feishu identities → principals: the first contact creates (or finds) a principal and an active binding."""
from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from hub.clock import Clock
from hub.ids import new_id
from hub.services.auth import AuthService, Caller
from hub.store.db import Database
from hub.store.tables import identity_bindings, principals


@dataclass(frozen=True)
class Viewer:
    """An authenticated Feishu operator: application, open_id, principal and active binding."""

    app_id: str
    open_id: str
    principal_id: str
    name: str
    binding_id: str
    is_admin: bool

    def caller(self) -> Caller:
        """Return the hub Caller this operator acts as (never an admin token: creator-scoped everywhere)."""
        return Caller(self.principal_id, self.name, f"feishu:{self.binding_id}", f"feishu:{self.app_id}", False)


class IdentityBindings:
    """Create and look up identity bindings (`identity_bindings`, shared with the alert pipeline)."""

    def __init__(self, db: Database, clock: Clock, auth: AuthService) -> None:
        self.db = db
        self.clock = clock
        self.auth = auth

    async def bind(self, app_id: str, open_id: str, admin_open_id: str | None, union_id: str | None = None,
                   user_id: str | None = None) -> Viewer | None:
        """Return the operator's Viewer, creating principal and binding on first contact; None when revoked."""
        for _ in range(2):  # a concurrent first contact loses the unique (app_id, open_id) race once
            try:
                async with self.db.write() as conn:
                    return await self._bind(conn, app_id, open_id, admin_open_id, union_id, user_id)
            except IntegrityError:
                continue
        return await self.find(app_id, open_id, admin_open_id)

    async def _bind(self, conn, app_id: str, open_id: str, admin_open_id: str | None,  # noqa: ANN001
                    union_id: str | None, user_id: str | None) -> Viewer | None:
        row = (await conn.execute(sa.select(identity_bindings).where(
            identity_bindings.c.app_id == app_id, identity_bindings.c.open_id == open_id))).first()
        if row is not None:
            if row.status != "active":
                return None
            fill = {k: v for k, v in (("union_id", union_id), ("user_id", user_id)) if v and not getattr(row, k)}
            if fill:
                await conn.execute(identity_bindings.update().where(identity_bindings.c.id == row.id).values(**fill))
            return await self._viewer(conn, row.id, app_id, open_id, row.principal_id, admin_open_id)
        principal_id = None
        if union_id:  # the same person through another application of this tenant: one principal
            same = (await conn.execute(sa.select(identity_bindings.c.principal_id).where(
                identity_bindings.c.union_id == union_id, identity_bindings.c.status == "active"))).scalars().all()
            if len(set(same)) == 1:
                principal_id = same[0]
        if principal_id is None:
            principal_id = await self.auth.ensure_principal(conn, f"feishu:{app_id}:{open_id}", "user")
        bid = new_id("ib")
        await conn.execute(identity_bindings.insert().values(
            id=bid, principal_id=principal_id, app_id=app_id, open_id=open_id, union_id=union_id or None,
            user_id=user_id or None, status="active", created_at=self.clock.now()))
        return await self._viewer(conn, bid, app_id, open_id, principal_id, admin_open_id)

    async def find(self, app_id: str, open_id: str, admin_open_id: str | None) -> Viewer | None:
        """Return the Viewer of an active binding, or None."""
        async with self.db.read() as conn:
            row = (await conn.execute(sa.select(identity_bindings).where(
                identity_bindings.c.app_id == app_id, identity_bindings.c.open_id == open_id,
                identity_bindings.c.status == "active"))).first()
            if row is None:
                return None
            return await self._viewer(conn, row.id, app_id, open_id, row.principal_id, admin_open_id)

    @staticmethod
    async def _viewer(conn, bid: str, app_id: str, open_id: str, principal_id: str,  # noqa: ANN001
                      admin_open_id: str | None) -> Viewer:
        name = (await conn.execute(sa.select(principals.c.name).where(principals.c.id == principal_id))).scalar()
        return Viewer(app_id, open_id, principal_id, name or principal_id, bid,
                      bool(admin_open_id) and open_id == admin_open_id)
