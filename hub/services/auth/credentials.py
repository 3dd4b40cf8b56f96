"""Credential profiles: declared variables, values encrypted per principal, materialized only at launch."""
from __future__ import annotations

import base64
import hashlib
import re

from cryptography.fernet import Fernet, InvalidToken

from ...clock import Clock
from ...errors import Forbidden, Invalid, NotFound
from ...store.db import Connection, Database
from ...store.profiles import SqlProfileStore
from .service import Caller

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
            raise Invalid("a stored credential cannot be decrypted with this AMUX_SECRET_KEY; use the key it was "
                          "stored with, or set the value again") from e


class CredentialService:
    """Declare credential profiles, store values per principal, materialize them for a launch."""

    def __init__(self, db: Database, clock: Clock, box: SecretBox | None) -> None:
        self.db = db
        self.clock = clock
        self.box = box
        self.store = SqlProfileStore(db)

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
        now = self.clock.now()
        await self.db.transaction(lambda conn: self.store.declare(conn, name, sorted(set(env_names)),
                                                                  caller.principal_id, now))
        return {"name": name, "env": sorted(set(env_names))}

    async def _declared(self, conn: Connection, name: str) -> list[str]:
        declared = await self.store.declared_env(conn, name)
        if declared is None:
            raise NotFound(f"credential profile {name!r} does not exist; "
                           f"declare it with `amux credential declare {name} --env VAR`")
        return declared

    async def set_value(self, caller: Caller, name: str, env_name: str, value: str) -> dict:
        """Store the caller's own value for one declared variable (encrypted)."""
        if self.box is None:
            raise Invalid(NO_KEY)
        if not value:
            raise Invalid("credential value is empty; pass the value on stdin")
        box = self.box

        async def store_value(conn: Connection) -> None:
            declared = await self._declared(conn, name)
            if env_name not in declared:
                raise Invalid(f"{env_name} is not declared by credential profile {name!r} "
                              f"(declared: {', '.join(declared)})")
            await self.store.set_value(conn, name, caller.principal_id, env_name, box.seal(value), self.clock.now())

        await self.db.transaction(store_value)
        return {"name": name, "env": env_name, "stored": True}

    async def check_complete(self, conn: Connection, name: str, principal_id: str, principal: str) -> list[str]:
        """Return the declared names, refusing when the principal lacks any value."""
        declared = await self._declared(conn, name)
        have = await self.store.stored_env(conn, name, principal_id)
        missing = [n for n in declared if n not in have]
        if missing:
            raise Invalid(f"credential profile {name!r} is missing {', '.join(missing)} for {principal}; "
                          f"set it with `amux credential set {name} {missing[0]}` (value on stdin)")
        return declared

    async def materialize(self, conn: Connection, name: str, principal_id: str) -> dict[str, str]:
        """Decrypt the declared variables of the effective principal, for one launch only."""
        if self.box is None:
            raise Invalid(NO_KEY)
        declared = set(await self._declared(conn, name))
        sealed = await self.store.sealed_values(conn, name, principal_id)
        return {env: self.box.open(text) for env, text in sealed.items() if env in declared}

    async def list(self) -> list[dict]:
        """Return declared profiles (names and variable names only)."""
        async with self.db.read() as conn:
            rows = await self.store.credential_profiles(conn)
        return [{"name": r.name, "env": r.env_names} for r in rows]
