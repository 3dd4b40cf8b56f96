"""Random keys shared by every replica through the database."""
from __future__ import annotations

import secrets
from datetime import datetime

import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from .db import Database
from .tables import hub_keys


async def shared_key(db: Database, name: str, now: datetime) -> bytes:
    """Return the key called `name`, creating it once; replicas racing to create it all get the winner's key."""
    for _ in (1, 2):
        async with db.read() as conn:
            row = (await conn.execute(sa.select(hub_keys.c.secret).where(hub_keys.c.name == name))).first()
        if row is not None:
            return bytes.fromhex(row.secret)
        try:
            async with db.write() as conn:
                await conn.execute(hub_keys.insert().values(name=name, secret=secrets.token_hex(32), created_at=now))
        except IntegrityError:
            continue  # another replica created it first: read theirs
    raise RuntimeError(f"hub key {name!r} could neither be read nor created")
