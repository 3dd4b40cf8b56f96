"""hub/store/identities.py on both stores: one test per rule its methods state."""
from __future__ import annotations

from datetime import timedelta

import pytest

from hub.clock import ManualClock, utc
from hub.store.db import Connection, Database
from hub.store.identities import SqlIdentityStore
from hub.store.tokens import SqlTokenStore
from tests.contract.races import race


@pytest.fixture
def ids(db: Database) -> SqlIdentityStore:
    """The identity store over each backend."""
    return SqlIdentityStore(db)


@pytest.fixture
async def people(db: Database, clock: ManualClock) -> tuple[str, str]:
    """Principals alice and bob."""
    tokens = SqlTokenStore(db)
    async with db.write() as conn:
        return (await tokens.ensure_principal(conn, "alice", "user", clock.now(), "pr_alice"),
                await tokens.ensure_principal(conn, "bob", "user", clock.now(), "pr_bob"))


async def bind(ids: SqlIdentityStore, conn: Connection, clock: ManualClock, binding_id: str, principal_id: str,
               open_id: str, app_id: str = "cli_a", union_id: str | None = None, user_id: str | None = None) -> bool:
    return await ids.add_binding(conn, binding_id=binding_id, principal_id=principal_id, app_id=app_id,
                                 open_id=open_id, union_id=union_id, user_id=user_id, now=clock.now())


# ---------------------------------------------------------------- bindings


async def test_binding_reads_active_and_revoked_bindings_and_active_binding_only_active_ones(db, ids, people, clock):
    alice, _ = people
    async with db.write() as conn:
        assert await bind(ids, conn, clock, "ib_1", alice, "ou_1")
        await ids.revoke_binding(conn, "ib_1")
        assert (await ids.binding(conn, "cli_a", "ou_1")).status == "revoked"
        assert await ids.active_binding(conn, "cli_a", "ou_1") is None
        assert await ids.binding(conn, "cli_b", "ou_1") is None


async def test_binding_with_lock_makes_a_second_reader_wait_for_the_first_change(db, ids, people, clock):
    alice, bob = people
    async with db.write() as conn:
        await bind(ids, conn, clock, "ib_1", alice, "ou_1")

    async def move_to_bob(conn: Connection) -> None:
        await ids.point_binding(conn, await ids.binding(conn, "cli_a", "ou_1", lock=True), bob, None, None)

    async def read_locked(conn: Connection) -> str:
        return (await ids.binding(conn, "cli_a", "ou_1", lock=True)).principal_id

    assert await race(db, move_to_bob, read_locked) == (None, bob)


async def test_binding_by_id_with_lock_makes_a_second_reader_wait_for_the_first_change(db, ids, people, clock):
    alice, _ = people
    async with db.write() as conn:
        await bind(ids, conn, clock, "ib_1", alice, "ou_1")

    async def unlink(conn: Connection) -> None:
        await ids.binding_by_id(conn, "ib_1", lock=True)
        await ids.revoke_binding(conn, "ib_1")

    async def read_locked(conn: Connection) -> str:
        return (await ids.binding_by_id(conn, "ib_1", lock=True)).status

    assert await race(db, unlink, read_locked) == (None, "revoked")
    async with db.read() as conn:
        assert await ids.binding_by_id(conn, "ib_missing") is None


async def test_sole_principal_of_union_names_a_principal_only_when_every_active_binding_agrees(db, ids, people, clock):
    alice, bob = people
    async with db.write() as conn:
        await bind(ids, conn, clock, "ib_1", alice, "ou_1", "cli_a", union_id="on_x")
        assert await ids.sole_principal_of_union(conn, "on_x") == alice
        await bind(ids, conn, clock, "ib_2", bob, "ou_2", "cli_b", union_id="on_x")
        assert await ids.sole_principal_of_union(conn, "on_x") is None
        await ids.revoke_binding(conn, "ib_2")  # revoked bindings do not count
        assert await ids.sole_principal_of_union(conn, "on_x") == alice
        assert await ids.sole_principal_of_union(conn, "on_nobody") is None


async def test_add_binding_loses_to_a_concurrent_first_contact_and_the_transaction_goes_on(db, ids, people, clock):
    alice, bob = people

    async def first(conn: Connection) -> bool:
        return await bind(ids, conn, clock, "ib_first", alice, "ou_1")

    async def second(conn: Connection) -> tuple[bool, str]:
        added = await bind(ids, conn, clock, "ib_second", bob, "ou_1")
        row = await ids.binding(conn, "cli_a", "ou_1", lock=True)
        await ids.fill_ids(conn, row, "on_1", None)  # this transaction still writes
        return added, row.id

    assert await race(db, first, second) == (True, (False, "ib_first"))
    async with db.read() as conn:
        row = await ids.binding(conn, "cli_a", "ou_1")
    assert (row.principal_id, row.union_id, row.status) == (alice, "on_1", "active")


async def test_fill_ids_fills_only_the_ids_a_binding_lacks(db, ids, people, clock):
    alice, _ = people
    async with db.write() as conn:
        await bind(ids, conn, clock, "ib_1", alice, "ou_1", union_id="on_known")
        await ids.fill_ids(conn, await ids.binding(conn, "cli_a", "ou_1"), "on_other", "u_1")
        row = await ids.binding(conn, "cli_a", "ou_1")
    assert (row.union_id, row.user_id) == ("on_known", "u_1")


async def test_point_binding_moves_and_reactivates_a_binding_filling_only_missing_ids(db, ids, people, clock):
    alice, bob = people
    async with db.write() as conn:
        await bind(ids, conn, clock, "ib_1", alice, "ou_1", user_id="u_known")
        await ids.revoke_binding(conn, "ib_1")
        await ids.point_binding(conn, await ids.binding(conn, "cli_a", "ou_1"), bob, "on_1", "u_other")
        row = await ids.binding(conn, "cli_a", "ou_1")
    assert (row.id, row.principal_id, row.status, row.union_id, row.user_id) == (
        "ib_1", bob, "active", "on_1", "u_known")


async def test_revoke_binding_is_idempotent_and_keeps_the_row(db, ids, people, clock):
    alice, _ = people
    async with db.write() as conn:
        await bind(ids, conn, clock, "ib_1", alice, "ou_1")
        await ids.revoke_binding(conn, "ib_1")
        await ids.revoke_binding(conn, "ib_1")
        row = await ids.binding_by_id(conn, "ib_1")
    assert (row.status, row.principal_id) == ("revoked", alice)


async def test_list_bindings_is_oldest_first_with_principal_names_per_principal_or_everyones(db, ids, people, clock):
    alice, bob = people
    async with db.write() as conn:
        await bind(ids, conn, clock, "ib_2", alice, "ou_1")
        clock.advance(1)
        await bind(ids, conn, clock, "ib_1", bob, "ou_2")
        clock.advance(1)
        await bind(ids, conn, clock, "ib_3", alice, "ou_3")
    async with db.read() as conn:
        everyone = await ids.list_bindings(conn, None)
        alices = await ids.list_bindings(conn, alice)
    assert [(b.id, b.principal_name) for b in everyone] == [("ib_2", "alice"), ("ib_1", "bob"), ("ib_3", "alice")]
    assert [b.id for b in alices] == ["ib_2", "ib_3"]


# ---------------------------------------------------------------- link codes


async def test_a_link_code_is_stored_unused_by_its_hash(db, ids, people, clock):
    alice, _ = people
    async with db.write() as conn:
        await ids.add_link_code(conn, code_id="ilc_1", principal_id=alice, code_hash="c" * 64, now=clock.now(),
                                expires_at=clock.now() + timedelta(minutes=10))
        row = await ids.link_code_to_redeem(conn, "c" * 64)
        assert await ids.link_code_to_redeem(conn, "d" * 64) is None
    assert (row.id, row.principal_id, row.used_at, row.binding_id) == ("ilc_1", alice, None, None)
    assert utc(row.expires_at) == clock.now() + timedelta(minutes=10)


async def test_link_code_to_redeem_lets_one_of_two_concurrent_redemptions_spend_the_code(db, ids, people, clock):
    alice, _ = people
    async with db.write() as conn:
        await ids.add_link_code(conn, code_id="ilc_1", principal_id=alice, code_hash="c" * 64, now=clock.now(),
                                expires_at=clock.now() + timedelta(minutes=10))

    async def redeem(conn: Connection) -> bool:
        row = await ids.link_code_to_redeem(conn, "c" * 64)
        if row.used_at is not None:
            return False
        await ids.spend_link_code(conn, row.id, "ib_1", clock.now())
        return True

    assert await race(db, redeem, redeem) == (True, False)


async def test_spend_link_code_records_when_and_the_binding_it_made(db, ids, people, clock):
    alice, _ = people
    async with db.write() as conn:
        await ids.add_link_code(conn, code_id="ilc_1", principal_id=alice, code_hash="c" * 64, now=clock.now(),
                                expires_at=clock.now() + timedelta(minutes=10))
        clock.advance(30)
        await ids.spend_link_code(conn, "ilc_1", "ib_9", clock.now())
        row = await ids.link_code_to_redeem(conn, "c" * 64)
    assert (utc(row.used_at), row.binding_id) == (clock.now(), "ib_9")

