"""Runtimes: registration, their runner connections and tokens, and what they offer (engines, platforms,
capabilities)."""
from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from ..domain.tasks import Status
from ..ids import new_id
from .db import Connection, Database, Row, one_of
from .tables import api_tokens, principals, reservations, runtimes

ACTIVE_RES = ("pending", "committed")
ON_RUNTIME = [Status.DISPATCHED.value, Status.RUNNING.value]
_OFFERS = sa.select(runtimes.c.name, runtimes.c.capabilities)  # admission reads it for every submission
_HEARTBEAT = (runtimes.update().where(runtimes.c.id == sa.bindparam("b_runtime_id"),
                                      runtimes.c.connection_id == sa.bindparam("b_connection_id"))
              .values(last_seen_at=sa.bindparam("b_now"), status="online"))
_LIVE_TOKENS = (sa.select(api_tokens.c.id).where(one_of(api_tokens.c.id, "b_ids"),
                                                        api_tokens.c.revoked_at.is_(None)))


class RegistrationRace(Exception):
    """Another transaction registered the same runtime name first (PostgreSQL); register again to see its row."""


class SqlRegistryStore:
    """Runtimes (`runtimes`): who registered them, their current connection and what they offer."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def list_all(self, conn: Connection) -> list[Row]:
        """Return every known runtime (any status), by name."""
        return list((await conn.execute(sa.select(runtimes).order_by(runtimes.c.name))).all())

    async def find(self, conn: Connection, ref: str) -> Row | None:
        """Return the runtime whose id or name is `ref`, or None."""
        return (await conn.execute(sa.select(runtimes).where(
            sa.or_(runtimes.c.id == ref, runtimes.c.name == ref)))).first()

    async def by_name(self, conn: Connection, name: str, *, lock: bool = False) -> Row | None:
        """Return the runtime called `name` (locked until the transaction ends when `lock`), or None."""
        stmt = sa.select(runtimes).where(runtimes.c.name == name)
        return (await conn.execute(self.db.for_update(stmt) if lock else stmt)).first()

    async def name_of(self, conn: Connection, runtime_id: str) -> tuple[str | None, dict[str, Any]]:
        """Return the runtime's name and the capabilities it reported, or (None, {}) when it is unknown
        (deregistered)."""
        row = (await conn.execute(sa.select(runtimes.c.name, runtimes.c.capabilities)
                                  .where(runtimes.c.id == runtime_id))).first()
        return (None, {}) if row is None else (row.name, dict(row.capabilities or {}))

    async def names(self, conn: Connection, limit: int = 20) -> list[str]:
        """Return up to `limit` runtime names, sorted (to list in a refusal)."""
        return list((await conn.execute(
            sa.select(runtimes.c.name).order_by(runtimes.c.name).limit(limit))).scalars())

    async def engine_offered(self, conn: Connection, engine: str) -> bool:
        """Say whether any registered runtime (any status) lists `engine` in its capabilities."""
        caps = (await conn.execute(sa.select(runtimes.c.capabilities))).scalars()
        return any(engine in c.get("engines", []) for c in caps)

    async def platforms_offering(self, conn: Connection, engine: str) -> dict[str, str | None]:
        """Map each registered runtime (any status) that lists `engine` to the platform it reported (None: none)."""
        rows = (await conn.execute(_OFFERS)).all()
        return {r.name: (r.capabilities or {}).get("platform") for r in rows
                if engine in (r.capabilities or {}).get("engines", [])}

    async def capabilities_offering(self, conn: Connection, engine: str) -> dict[str, dict[str, Any]]:
        """Map each registered runtime (any status) that lists `engine` to the capabilities it reported."""
        rows = (await conn.execute(_OFFERS)).all()
        return {r.name: dict(r.capabilities or {}) for r in rows if engine in (r.capabilities or {}).get("engines", [])}

    async def owner_name(self, conn: Connection, principal_id: str) -> str | None:
        """Return the name of the principal that owns a runtime (to say who holds a name)."""
        return (await conn.execute(sa.select(principals.c.name).where(principals.c.id == principal_id))).scalar()

    async def register(self, conn: Connection, *, runtime_id: str | None, name: str, principal_id: str,
                       capabilities: dict[str, Any], slots: int, shared: bool, connection_id: str,
                       now: datetime, token_id: str | None = None) -> str:
        """Mark the runtime online under `connection_id` with its latest capabilities and slots, bound to the token
        `token_id` that registered it, inserting it when `runtime_id` is None; return its id. A concurrent first
        registration of `name` raises RegistrationRace."""
        values = dict(capabilities=capabilities, slots=slots, status="online", connection_id=connection_id,
                      last_seen_at=now, shared=shared, token_id=token_id)
        if runtime_id is not None:
            await conn.execute(runtimes.update().where(runtimes.c.id == runtime_id).values(**values))
            return runtime_id
        new = new_id("rt")
        try:
            await conn.execute(runtimes.insert().values(id=new, name=name, principal_id=principal_id,
                                                        registered_at=now, **values))
        except IntegrityError as e:
            raise RegistrationRace(name) from e
        return new

    async def heartbeat(self, conn: Connection, runtime_id: str, connection_id: str, now: datetime) -> None:
        """Record that the runtime is alive and online — only while `connection_id` is its current connection."""
        await conn.execute(_HEARTBEAT, {"b_runtime_id": runtime_id, "b_connection_id": connection_id, "b_now": now})

    async def mark_offline(self, conn: Connection, runtime_id: str, connection_id: str) -> None:
        """Mark the runtime offline — only if `connection_id` is still its current connection (a newer one wins)."""
        await conn.execute(runtimes.update().where(runtimes.c.id == runtime_id,
                                                   runtimes.c.connection_id == connection_id)
                           .values(status="offline", connection_id=None))

    async def connection(self, conn: Connection, runtime_id: str) -> tuple[str | None, dict[str, Any]]:
        """Return the runtime's current connection id and capabilities (the runtime must exist)."""
        current, caps = (await conn.execute(sa.select(runtimes.c.connection_id, runtimes.c.capabilities)
                                            .where(runtimes.c.id == runtime_id))).one()
        return current, caps

    async def connections(self, conn: Connection,
                          runtime_ids: list[str]) -> dict[str, tuple[str | None, dict[str, Any]]]:
        """Return each known runtime's current connection id and capabilities; deregistered ones are absent."""
        if not runtime_ids:
            return {}
        return {r.id: (r.connection_id, r.capabilities) for r in await conn.execute(
            sa.select(runtimes.c.id, runtimes.c.connection_id, runtimes.c.capabilities)
            .where(one_of(runtimes.c.id, set(runtime_ids))))}

    async def open_reservations(self, conn: Connection, runtime_id: str) -> int:
        """Count the runtime's reservations not yet released."""
        return int((await conn.execute(sa.select(sa.func.count()).select_from(reservations).where(
            reservations.c.runtime_id == runtime_id, reservations.c.state != "released"))).scalar_one())

    async def reap(self, conn: Connection, offline_before: datetime) -> list[str]:
        """Delete every runtime offline since before `offline_before` whose reservations are all released (and
        those reservations); return their names. Each runtime goes in one statement that checks again that it is
        still offline and idle, so a runner that reconnects meanwhile, on any replica, keeps its row."""
        stale = [r.id for r in (await conn.execute(sa.select(runtimes.c.id).where(
            runtimes.c.status != "online", runtimes.c.last_seen_at < offline_before))).all()]
        names: list[str] = []
        for runtime_id in stale:
            busy = sa.exists().where(reservations.c.runtime_id == runtime_id, reservations.c.state != "released")
            idle = sa.and_(runtimes.c.id == runtime_id, runtimes.c.status != "online",
                           runtimes.c.last_seen_at < offline_before, ~busy)
            await conn.execute(reservations.delete().where(  # its released ones first (they name it)
                reservations.c.runtime_id == runtime_id, reservations.c.state == "released",
                sa.exists().where(idle)))
            gone = (await conn.execute(runtimes.delete().where(idle).returning(runtimes.c.name))).first()
            if gone is not None:
                names.append(gone.name)
        return names

    async def delete(self, conn: Connection, runtime_id: str) -> None:
        """Delete the runtime and its (released) reservations, freeing its name."""
        await conn.execute(reservations.delete().where(reservations.c.runtime_id == runtime_id))
        await conn.execute(runtimes.delete().where(runtimes.c.id == runtime_id))

    async def count_by_status(self, conn: Connection) -> dict[str, int]:
        """Count runtimes per status; statuses without runtimes are absent."""
        return {status: int(n) for status, n in (await conn.execute(
            sa.select(runtimes.c.status, sa.func.count()).group_by(runtimes.c.status))).all()}

    async def runner_token_live(self, conn: Connection, token_id: str) -> bool:
        """Say whether the connection's token still exists unrevoked (a revocation on any replica counts)."""
        return token_id in await self.live_tokens(conn, [token_id])

    async def live_tokens(self, conn: Connection, token_ids: list[str]) -> set[str]:
        """Return those of `token_ids` that still exist unrevoked (a revocation on any replica counts)."""
        if not token_ids:
            return set()
        return {r.id for r in (await conn.execute(_LIVE_TOKENS, {"b_ids": sorted(set(token_ids))})).all()}
