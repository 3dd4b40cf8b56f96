"""Profiles: builtin shortcuts plus stored manifest-v2 profiles."""
from __future__ import annotations

import builtins
from dataclasses import dataclass

from ...clock import Clock
from ...domain.manifest import ManifestV2, parse_manifest
from ...domain.resolution import ProfileView
from ...errors import Forbidden, Invalid
from ...profiles import BUILTINS
from ...store.db import Connection, Database
from ...store.profiles import SqlProfileStore
from ..auth.service import Caller


@dataclass(frozen=True, kw_only=True)
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


# The builtins' listing (and digests) as of import: builtins are code, not data, so they cannot change while the hub
# runs; computing a digest is a JSON dump and a SHA-256 per profile, which MCP `profile_list` paid at every call.
BUILTIN_LISTING: tuple[dict, ...] = tuple(p.public() for p in BUILTINS.values())
BUILTIN_DIGESTS: dict[str, str] = {p["name"]: p["digest"] for p in BUILTIN_LISTING}


class ProfileService:
    """Find, list and store profiles."""

    def __init__(self, db: Database, clock: Clock) -> None:
        self.db = db
        self.clock = clock
        self.store = SqlProfileStore(db)

    async def add(self, caller: Caller, text: str) -> dict:
        """Store (or replace) a v2 manifest; admin only; builtin names are reserved."""
        if not caller.admin:
            raise Forbidden("adding profiles needs an admin token (amux token create --admin)")
        manifest = parse_manifest(text)
        if manifest.name in BUILTINS:
            raise Invalid(f"{manifest.name!r} is a builtin shortcut; give the profile another name")
        now = self.clock.now()
        digest = manifest.digest()
        await self.db.transaction(lambda conn: self.store.save(
            conn, name=manifest.name, engine=manifest.engine, manifest=manifest.model_dump(), digest=digest,
            created_by=caller.principal_id, now=now))
        return {"name": manifest.name, "engine": manifest.engine, "digest": digest}

    async def get(self, conn: Connection, name: str) -> ResolvedProfile:
        """Return a builtin or stored profile, refusing unknown names with where to look."""
        builtin = BUILTINS.get(name)
        if builtin is not None:
            return ResolvedProfile(name=builtin.name, engine=builtin.engine, kind="builtin",
                                   digest=BUILTIN_DIGESTS[name], manifest=None)
        row = await self.store.get(conn, name)
        if row is None:
            raise Invalid(f"unknown profile {name!r}; choose a builtin ({', '.join(sorted(BUILTINS))}) "
                          f"or a stored profile (see profile_list)")
        manifest = ManifestV2.model_validate(row.manifest)
        return ResolvedProfile(name=row.name, engine=row.engine, kind="manifest", digest=row.digest, manifest=manifest)

    async def list(self) -> list[dict]:
        """Return builtins, then stored profiles."""
        return [dict(p) for p in BUILTIN_LISTING] + await self.stored()

    async def stored(self) -> builtins.list[dict]:
        """Return the stored profiles, by name (one read: the MCP hot path)."""
        async with self.db.read() as conn:
            rows = await self.store.list_all(conn)
        return [{"name": r.name, "engine": r.engine, "kind": "manifest",
                 "description": r.manifest.get("description", ""), "digest": r.digest} for r in rows]
