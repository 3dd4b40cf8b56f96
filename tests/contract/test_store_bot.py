"""SqlBotStore on SQLite and PostgreSQL: one test per rule a method states."""
from __future__ import annotations

import asyncio
from datetime import timedelta

import pytest
import sqlalchemy as sa

from hub.store.bot import Duplicate, SqlBotStore
from hub.store.db import Database
from hub.store.tables import bot_inbound


@pytest.fixture
def store(db: Database) -> SqlBotStore:
    return SqlBotStore(db)


async def test_a_chat_and_operator_have_one_session_a_second_binding_raises(db, store, clock):
    now = clock.now()
    async with db.read() as conn:
        assert await store.session_of_chat(conn, "cli_a", "oc_1", "prn_1") is None
    async with db.write() as conn:
        await store.add_chat(conn, app_id="cli_a", chat_id="oc_1", principal_id="prn_1", session_id="ses_1", now=now)
        await store.add_chat(conn, app_id="cli_a", chat_id="oc_1", principal_id="prn_2", session_id="ses_2", now=now)
        await store.add_chat(conn, app_id="cli_b", chat_id="oc_1", principal_id="prn_1", session_id="ses_3", now=now)
    with pytest.raises(Duplicate):
        async with db.write() as conn:
            await store.add_chat(conn, app_id="cli_a", chat_id="oc_1", principal_id="prn_1", session_id="ses_x",
                                 now=now)
    async with db.read() as conn:
        assert await store.session_of_chat(conn, "cli_a", "oc_1", "prn_1") == "ses_1"
        assert await store.session_of_chat(conn, "cli_a", "oc_1", "prn_2") == "ses_2"
        assert await store.session_of_chat(conn, "cli_b", "oc_1", "prn_1") == "ses_3"


async def test_a_lease_is_held_by_one_holder_until_it_expires_and_renewed_only_by_its_holder(db, store, clock):
    async def claim(holder: str) -> bool:
        t = clock.now()
        async with db.write() as conn:
            return await store.claim_lease(conn, "longconn:cli", holder, now=t, until=t + timedelta(seconds=30))

    assert await claim("r1")                       # nobody had it
    assert not await claim("r2")                   # live: r1's
    clock.advance(20)
    assert await claim("r1")                       # the holder renews: now until +50
    clock.advance(20)
    assert not await claim("r2")                   # still live thanks to the renewal
    clock.advance(11)
    assert await claim("r2")                       # expired: r2 takes it over
    assert not await claim("r1")
    async with db.read() as conn:
        holder, until = await store.lease_holder(conn, "longconn:cli")
        assert holder == "r2" and until == clock.now() + timedelta(seconds=30)
        assert await store.lease_holder(conn, "longconn:none") is None


async def test_replicas_racing_to_create_a_lease_one_wins_the_others_raise_duplicate(db, store, clock):
    if db.is_sqlite:  # one process, writers serialized: the second sees the first's row and is refused
        now = clock.now()
        async with db.write() as conn:
            assert await store.claim_lease(conn, "l", "r1", now=now, until=now + timedelta(seconds=30))
        async with db.write() as conn:
            assert not await store.claim_lease(conn, "l", "r2", now=now, until=now + timedelta(seconds=30))
        return
    dbs = [Database(db.url) for _ in range(4)]
    now = clock.now()

    async def claim(i: int) -> bool | str:
        try:
            async with dbs[i].write() as conn:
                return await SqlBotStore(dbs[i]).claim_lease(conn, "l", f"r{i}", now=now,
                                                             until=now + timedelta(seconds=30))
        except Duplicate:
            return "duplicate"

    try:
        results = await asyncio.gather(*(claim(i) for i in range(4)))
    finally:
        for d in dbs:
            await d.close()
    assert results.count(True) == 1 and all(r in (False, "duplicate") for r in results if r is not True)


async def test_release_leases_drops_every_lease_of_that_holder_only(db, store, clock):
    now = clock.now()
    async with db.write() as conn:
        for name, holder in [("a", "r1"), ("b", "r1"), ("c", "r2")]:
            await store.claim_lease(conn, name, holder, now=now, until=now + timedelta(seconds=30))
    async with db.write() as conn:
        assert await store.release_leases(conn, "r1") == 2
    async with db.read() as conn:
        assert await store.lease_holder(conn, "a") is None and await store.lease_holder(conn, "b") is None
        assert (await store.lease_holder(conn, "c"))[0] == "r2"
    async with db.write() as conn:  # released: another replica takes it at once, before it would have expired
        assert await store.claim_lease(conn, "a", "r2", now=now, until=now + timedelta(seconds=30))


async def test_an_inbound_key_is_recorded_once_cut_to_250_characters(db, store, clock):
    now = clock.now()
    long_key = "event:" + "x" * 400
    async with db.write() as conn:
        await store.first_seen(conn, "cli_a", long_key, now)
    for key in (long_key, long_key[:250] + "different tail"):
        with pytest.raises(Duplicate):
            async with db.write() as conn:
                await store.first_seen(conn, "cli_a", key, now)
    async with db.read() as conn:
        keys = (await conn.execute(sa.select(bot_inbound.c.key))).scalars().all()
    assert keys == [long_key[:250]]


async def test_prune_inbound_forgets_keys_received_before_the_cutoff(db, store, clock):
    now = clock.now()
    async with db.write() as conn:
        await store.first_seen(conn, "cli_a", "old", now - timedelta(days=3))
        await store.first_seen(conn, "cli_a", "new", now)
        assert await store.prune_inbound(conn, now - timedelta(days=2)) == 1
    async with db.write() as conn:  # forgotten: the old key may be recorded again
        await store.first_seen(conn, "cli_a", "old", now)
