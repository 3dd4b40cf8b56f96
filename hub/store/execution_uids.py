"""The uid each principal's linux-dac task children run under: one per principal, never shared, kept for good."""
from __future__ import annotations

from datetime import datetime
from typing import Collection

import sqlalchemy as sa

from .db import Connection
from .tables import execution_uids


class SqlExecutionUidStore:
    """Read and allocate execution uids inside the caller's transaction."""

    async def of(self, conn: Connection, principal_ids: Collection[str]) -> dict[str, int]:
        """Return the uids these principals already hold."""
        if not principal_ids:
            return {}
        rows = await conn.execute(sa.select(execution_uids.c.principal_id, execution_uids.c.uid)
                                  .where(execution_uids.c.principal_id.in_(sorted(principal_ids))))
        return {r.principal_id: r.uid for r in rows}

    async def allocate(self, conn: Connection, principal_ids: Collection[str], base: int, count: int,
                       now: datetime) -> dict[str, int]:
        """Return a uid for each principal that has or can get one, allocating the lowest free uids in
        [base, base + count) to those without.

        Rule: the caller holds placement's lock (`Database.serialize(conn, "placement")`), so two replicas never
        allocate at once; the unique uid column refuses a double allocation all the same. A principal left out of
        the answer waits: the range is exhausted.
        """
        held = await self.of(conn, principal_ids)
        missing = sorted(set(principal_ids) - set(held))
        if not missing:
            return held
        taken = set((await conn.execute(sa.select(execution_uids.c.uid).where(
            execution_uids.c.uid >= base, execution_uids.c.uid < base + count))).scalars())
        free = (u for u in range(base, base + count) if u not in taken)
        rows = []
        for principal_id in missing:
            uid = next(free, None)
            if uid is None:
                break
            rows.append({"principal_id": principal_id, "uid": uid, "created_at": now})
            held[principal_id] = uid
        if rows:
            await conn.execute(execution_uids.insert(), rows)
        return held

    async def exhausted(self, conn: Connection, principal_id: str, base: int, count: int) -> bool:
        """Say whether `principal_id` holds no uid and none is left in the range."""
        if await self.of(conn, [principal_id]):
            return False
        used = (await conn.execute(sa.select(sa.func.count()).select_from(execution_uids).where(
            execution_uids.c.uid >= base, execution_uids.c.uid < base + count))).scalar_one()
        return used >= count
