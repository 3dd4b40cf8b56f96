"""Credential profiles: declared variables, values encrypted per principal, materialized only at launch."""
from __future__ import annotations

import base64
import hashlib
import re

import sqlalchemy as sa
from cryptography.fernet import Fernet, InvalidToken

from ..clock import Clock
from ..errors import Forbidden, Invalid, NotFound
from ..store.db import Database
from ..store.tables import credential_profiles, credential_values
from .auth import Caller

ENV_NAME = re.compile(r"^[A-Z_][A-Z0-9_]{0,127}$")
NAME = re.compile(r"^[a-z0-9][a-z0-9._-]{0,63}$")
NO_KEY = "credential values need a secret key: set AMUX_SECRET_KEY (or secret_key in amux.toml) on every hub replica"


class SecretBox:
    """Encrypt and decrypt credential values with a key derived from AMUX_SECRET_KEY."""

    def __init__(self, secret_key: str) -> None:
        self._fernet = Fernet(base64.urlsafe_b64encode(hashlib.sha256(secret_key.encode()).digest()))

    def seal(self, value: str) -> str:
        """Return ciphertext for `value`."""
        return self._fernet.encrypt(value.encode()).decode()

    def open(self, token: str) -> str:
        """Return the value; refuse ciphertext from another key."""
        try:
            return self._fernet.decrypt(token.encode()).decode()
        except InvalidToken as e:
            raise Invalid("a stored credential cannot be decrypted with this AMUX_SECRET_KEY; use the key it was stored with, or set the value again") from e


class CredentialService:
    """Declare credential profiles, store values per principal, materialize them for a launch."""

    def __init__(self, db: Database, clock: Clock, box: SecretBox | None) -> None:
        self.db = db
        self.clock = clock
        self.box = box

    async def declare(self, caller: Caller, name: str, env_names: list[str]) -> dict:
        """Create or redeclare a credential profile (admin)."""
        if not caller.admin:
            raise Forbidden("declaring credential profiles needs an admin token; ask an operator, who makes one with "
                            "`amux token create --principal NAME --admin`")
        if not NAME.match(name or ""):
            raise Invalid("credential profile name must match [a-z0-9][a-z0-9._-]{0,63}, e.g. anthropic")
        bad = [n for n in env_names if not ENV_NAME.match(n)]
        if not env_names or bad:
            raise Invalid(f"declare at least one environment variable name like ANTHROPIC_API_KEY; bad: {bad}")
        async with self.db.write() as conn:
            exists = (await conn.execute(sa.select(credential_profiles.c.name).where(credential_profiles.c.name == name))).first()
            if exists:
                await conn.execute(credential_profiles.update().where(credential_profiles.c.name == name)
                                   .values(env_names=sorted(set(env_names))))
            else:
                await conn.execute(credential_profiles.insert().values(
                    name=name, env_names=sorted(set(env_names)), created_by=caller.principal_id, created_at=self.clock.now()))
        return {"name": name, "env": sorted(set(env_names))}

    async def _declared(self, conn, name: str) -> list[str]:  # noqa: ANN001
        row = (await conn.execute(sa.select(credential_profiles.c.env_names).where(credential_profiles.c.name == name))).first()
        if row is None:
            raise NotFound(f"credential profile {name!r} does not exist; declare it with `amux credential declare {name} --env VAR`")
        return list(row.env_names)

    async def set_value(self, caller: Caller, name: str, env_name: str, value: str) -> dict:
        """Store the caller's own value for one declared variable (encrypted)."""
        if self.box is None:
            raise Invalid(NO_KEY)
        if not value:
            raise Invalid("credential value is empty; pass the value on stdin")
        async with self.db.write() as conn:
            declared = await self._declared(conn, name)
            if env_name not in declared:
                raise Invalid(f"{env_name} is not declared by credential profile {name!r} (declared: {', '.join(declared)})")
            sealed = self.box.seal(value)
            key = (credential_values.c.profile_name == name) & (credential_values.c.principal_id == caller.principal_id) \
                & (credential_values.c.env_name == env_name)
            done = await conn.execute(credential_values.update().where(key).values(ciphertext=sealed, updated_at=self.clock.now()))
            if done.rowcount == 0:
                await conn.execute(credential_values.insert().values(
                    profile_name=name, principal_id=caller.principal_id, env_name=env_name,
                    ciphertext=sealed, updated_at=self.clock.now()))
        return {"name": name, "env": env_name, "stored": True}

    async def check_complete(self, conn, name: str, principal_id: str, principal: str) -> list[str]:  # noqa: ANN001
        """Return the declared names, refusing when the principal lacks any value."""
        declared = await self._declared(conn, name)
        have = {r.env_name for r in await conn.execute(sa.select(credential_values.c.env_name).where(
            credential_values.c.profile_name == name, credential_values.c.principal_id == principal_id))}
        missing = [n for n in declared if n not in have]
        if missing:
            raise Invalid(f"credential profile {name!r} is missing {', '.join(missing)} for {principal}; "
                          f"set it with `amux credential set {name} {missing[0]}` (value on stdin)")
        return declared

    async def materialize(self, conn, name: str, principal_id: str) -> dict[str, str]:  # noqa: ANN001
        """Decrypt the declared variables of the effective principal, for one launch only."""
        if self.box is None:
            raise Invalid(NO_KEY)
        declared = set(await self._declared(conn, name))
        rows = (await conn.execute(sa.select(credential_values).where(
            credential_values.c.profile_name == name, credential_values.c.principal_id == principal_id))).all()
        return {r.env_name: self.box.open(r.ciphertext) for r in rows if r.env_name in declared}

    async def list(self) -> list[dict]:
        """Return declared profiles (names and variable names only)."""
        async with self.db.read() as conn:
            rows = (await conn.execute(sa.select(credential_profiles).order_by(credential_profiles.c.name))).all()
        return [{"name": r.name, "env": r.env_names} for r in rows]
