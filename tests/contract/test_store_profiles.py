"""SqlProfileStore: each rule its methods state, on SQLite and PostgreSQL."""
from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from hub.clock import utc
from hub.store.db import Database
from hub.store.profiles import SqlProfileStore
from hub.store.tables import credential_profiles, credential_values
from tests.contract.task_rows import T0, principal


@pytest.fixture
def store(db: Database) -> SqlProfileStore:
    """The profile store over each backend."""
    return SqlProfileStore(db)


async def test_a_stored_profile_is_found_by_name_and_listed_by_name(db, store):
    async with db.write() as conn:
        admin = await principal(conn)
        for name in ("zeta", "alpha"):
            await store.save(conn, name=name, engine="claude", manifest={"name": name}, digest=f"sha256:{name}",
                             created_by=admin, now=T0)
        assert (await store.get(conn, "zeta")).digest == "sha256:zeta"
        assert await store.get(conn, "nope") is None
        assert [r.name for r in await store.list_all(conn)] == ["alpha", "zeta"]


async def test_saving_a_profile_again_replaces_it_and_keeps_its_creator_and_creation_time(db, store):
    async with db.write() as conn:
        first, second = await principal(conn), await principal(conn)
        await store.save(conn, name="p", engine="claude", manifest={"v": 1}, digest="d1", created_by=first, now=T0)
        later = T0 + timedelta(days=1)
        await store.save(conn, name="p", engine="codex", manifest={"v": 2}, digest="d2", created_by=second, now=later)
        r = await store.get(conn, "p")
    assert (r.engine, r.manifest, r.digest, r.created_by) == ("codex", {"v": 2}, "d2", first)
    assert utc(r.created_at) == T0 and utc(r.updated_at) == later


async def test_declared_env_is_none_for_an_undeclared_credential_profile(db, store):
    async with db.write() as conn:
        admin = await principal(conn)
        assert await store.declared_env(conn, "openai") is None
        await store.declare(conn, "openai", ["OPENAI_API_KEY"], admin, T0)
        assert await store.declared_env(conn, "openai") == ["OPENAI_API_KEY"]


async def test_redeclaring_a_credential_profile_replaces_its_names_and_keeps_its_creator(db, store):
    async with db.write() as conn:
        first, second = await principal(conn), await principal(conn)
        await store.declare(conn, "openai", ["A"], first, T0)
        await store.declare(conn, "openai", ["B", "C"], second, T0 + timedelta(hours=1))
        r = (await conn.execute(sa.select(credential_profiles))).one()
    assert (r.env_names, r.created_by, utc(r.created_at)) == (["B", "C"], first, T0)


async def test_credential_profiles_are_listed_by_name(db, store):
    async with db.write() as conn:
        admin = await principal(conn)
        for name in ("zz", "aa"):
            await store.declare(conn, name, ["X"], admin, T0)
        assert [(r.name, r.env_names) for r in await store.credential_profiles(conn)] == [("aa", ["X"]), ("zz", ["X"])]


async def test_setting_a_value_again_replaces_the_principals_ciphertext(db, store):
    async with db.write() as conn:
        alice = await principal(conn)
        await store.declare(conn, "openai", ["K"], alice, T0)
        await store.set_value(conn, "openai", alice, "K", "sealed-1", T0)
        await store.set_value(conn, "openai", alice, "K", "sealed-2", T0 + timedelta(minutes=1))
        rows = (await conn.execute(sa.select(credential_values))).all()
    assert [(r.env_name, r.ciphertext, utc(r.updated_at)) for r in rows] == [
        ("K", "sealed-2", T0 + timedelta(minutes=1))]


async def test_stored_values_are_per_principal_and_per_profile(db, store):
    async with db.write() as conn:
        alice, bob = await principal(conn), await principal(conn)
        await store.declare(conn, "openai", ["K", "ORG"], alice, T0)
        await store.declare(conn, "other", ["K"], alice, T0)
        await store.set_value(conn, "openai", alice, "K", "a-k", T0)
        await store.set_value(conn, "openai", alice, "ORG", "a-org", T0)
        await store.set_value(conn, "openai", bob, "K", "b-k", T0)
        await store.set_value(conn, "other", bob, "K", "b-other", T0)
        assert await store.stored_env(conn, "openai", alice) == {"K", "ORG"}
        assert await store.stored_env(conn, "openai", bob) == {"K"}
        assert await store.sealed_values(conn, "openai", alice) == {"K": "a-k", "ORG": "a-org"}
        assert await store.sealed_values(conn, "openai", bob) == {"K": "b-k"}
        assert await store.sealed_values(conn, "nope", bob) == {}
