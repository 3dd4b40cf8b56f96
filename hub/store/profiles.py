"""Stored manifest-v2 profiles and credential profiles with their encrypted values."""
from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa

from .db import Connection, Database, Row
from .tables import credential_profiles, credential_values, profiles

# Built once: a statement built per call costs its construction again at every execution (MCP `profile_list`).
_LIST_ALL = sa.select(profiles).order_by(profiles.c.name)


class SqlProfileStore:
    """Profiles (`profiles`), credential profiles and per-principal credential values (ciphertext only)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    async def get(self, conn: Connection, name: str) -> Row | None:
        """Return the stored profile called `name` (name, engine, manifest, digest, …), or None."""
        return (await conn.execute(sa.select(profiles).where(profiles.c.name == name))).first()

    async def list_all(self, conn: Connection) -> list[Any]:
        """Return every stored profile, by name."""
        return list((await conn.execute(_LIST_ALL)).all())

    async def save(self, conn: Connection, *, name: str, engine: str, manifest: dict[str, Any], digest: str,
                   created_by: str, now: datetime) -> None:
        """Store a manifest under its name: replace a stored one (its creator and creation time stay) or insert it."""
        values = dict(engine=engine, manifest=manifest, digest=digest, updated_at=now)
        done = await conn.execute(profiles.update().where(profiles.c.name == name).values(**values))
        if done.rowcount == 0:
            await conn.execute(profiles.insert().values(name=name, created_by=created_by, created_at=now, **values))

    async def declared_env(self, conn: Connection, name: str) -> list[str] | None:
        """Return the variable names credential profile `name` declares, or None when it is not declared."""
        row = (await conn.execute(sa.select(credential_profiles.c.env_names)
                                  .where(credential_profiles.c.name == name))).first()
        return None if row is None else list(row.env_names)

    async def declare(self, conn: Connection, name: str, env_names: list[str], created_by: str,
                      now: datetime) -> None:
        """Declare credential profile `name` with `env_names`; redeclaring replaces the names (creator stays)."""
        exists = (await conn.execute(sa.select(credential_profiles.c.name)
                                     .where(credential_profiles.c.name == name))).first()
        if exists:
            await conn.execute(credential_profiles.update().where(credential_profiles.c.name == name)
                               .values(env_names=env_names))
        else:
            await conn.execute(credential_profiles.insert().values(
                name=name, env_names=env_names, created_by=created_by, created_at=now))

    async def credential_profiles(self, conn: Connection) -> list[Row]:
        """Return every declared credential profile (name, env_names), by name."""
        return list((await conn.execute(sa.select(credential_profiles).order_by(credential_profiles.c.name))).all())

    async def set_value(self, conn: Connection, profile: str, principal_id: str, env_name: str, ciphertext: str,
                        now: datetime) -> None:
        """Store the principal's sealed value of one variable, replacing the one it had."""
        key = (credential_values.c.profile_name == profile) & (credential_values.c.principal_id == principal_id) \
            & (credential_values.c.env_name == env_name)
        done = await conn.execute(credential_values.update().where(key).values(ciphertext=ciphertext, updated_at=now))
        if done.rowcount == 0:
            await conn.execute(credential_values.insert().values(
                profile_name=profile, principal_id=principal_id, env_name=env_name,
                ciphertext=ciphertext, updated_at=now))

    async def stored_env(self, conn: Connection, profile: str, principal_id: str) -> set[str]:
        """Return the names of the variables the principal has a value for under `profile`."""
        return set((await conn.execute(sa.select(credential_values.c.env_name).where(
            credential_values.c.profile_name == profile, credential_values.c.principal_id == principal_id))).scalars())

    async def sealed_values(self, conn: Connection, profile: str, principal_id: str) -> dict[str, str]:
        """Return the principal's sealed values under `profile`, by variable name (ciphertext, never decrypted here)."""
        rows = (await conn.execute(sa.select(credential_values.c.env_name, credential_values.c.ciphertext).where(
            credential_values.c.profile_name == profile, credential_values.c.principal_id == principal_id))).all()
        return {r.env_name: r.ciphertext for r in rows}
