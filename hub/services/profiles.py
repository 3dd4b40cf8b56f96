"""Profiles: builtin shortcuts plus stored manifest-v2 profiles."""
from __future__ import annotations

from dataclasses import dataclass

import sqlalchemy as sa

from ..clock import Clock
from ..domain.manifest import ManifestV2, parse_manifest
from ..domain.resolution import ProfileView
from ..errors import Forbidden, Invalid
from ..profiles import BUILTINS
from ..store.db import Database
from ..store.tables import profiles
from .auth import Caller


@dataclass(frozen=True)
class ResolvedProfile:
    """A profile as admission uses it."""

    name: str
    engine: str
    kind: str  # builtin | manifest
    digest: str
    manifest: ManifestV2 | None

    def view(self) -> ProfileView:
        """Return what resolution needs."""
        allow = self.manifest.policy.allow_model_override if self.manifest else True
        return ProfileView(self.name, self.engine, builtin=self.kind == "builtin", allow_model_override=allow)


class ProfileService:
    """Find, list and store profiles."""

    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock

    async def add(self, caller: Caller, text: str) -> dict:
        """Store (or replace) a v2 manifest; admin only; builtin names are reserved."""
        if not caller.admin:
            raise Forbidden("adding profiles needs an admin token (amux token create --admin)")
        manifest = parse_manifest(text)
        if manifest.name in BUILTINS:
            raise Invalid(f"{manifest.name!r} is a builtin shortcut; give the profile another name")
        now = self.clock.now()
        values = dict(engine=manifest.engine, manifest=manifest.model_dump(), digest=manifest.digest(), updated_at=now)
        async with self.db.write() as conn:
            done = await conn.execute(profiles.update().where(profiles.c.name == manifest.name).values(**values))
            if done.rowcount == 0:
                await conn.execute(profiles.insert().values(name=manifest.name, created_by=caller.principal_id,
                                                            created_at=now, **values))
        return {"name": manifest.name, "engine": manifest.engine, "digest": values["digest"]}

    async def get(self, conn, name: str) -> ResolvedProfile:  # noqa: ANN001
        """Return a builtin or stored profile, refusing unknown names with where to look."""
        builtin = BUILTINS.get(name)
        if builtin is not None:
            return ResolvedProfile(builtin.name, builtin.engine, "builtin", builtin.digest(), None)
        row = (await conn.execute(sa.select(profiles).where(profiles.c.name == name))).first()
        if row is None:
            raise Invalid(f"unknown profile {name!r}; choose a builtin ({', '.join(sorted(BUILTINS))}) "
                          f"or a stored profile (see profile_list)")
        manifest = ManifestV2.model_validate(row.manifest)
        return ResolvedProfile(row.name, row.engine, "manifest", row.digest, manifest)

    async def list(self) -> list[dict]:
        """Return builtins, then stored profiles."""
        out = [p.public() for p in BUILTINS.values()]
        async with self.db.read() as conn:
            for r in await conn.execute(sa.select(profiles).order_by(profiles.c.name)):
                out.append({"name": r.name, "engine": r.engine, "kind": "manifest",
                            "description": r.manifest.get("description", ""), "digest": r.digest})
        return out
