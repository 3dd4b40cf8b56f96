"""hub/store/tokens.py on both stores: one test per rule its methods state."""
from __future__ import annotations

from datetime import timedelta

import pytest
import sqlalchemy as sa

from hub.clock import ManualClock, utc
from hub.store.db import Connection, Database
from hub.store.tables import oauth_grants, oauth_tokens, task_runs
from hub.store.tokens import SqlOAuthStore, SqlTokenStore
from tests.contract.races import race


@pytest.fixture
def tokens(db: Database) -> SqlTokenStore:
    """The token store over each backend."""
    return SqlTokenStore(db)


@pytest.fixture
def oauth(db: Database) -> SqlOAuthStore:
    """The OAuth store over each backend."""
    return SqlOAuthStore(db)


async def token(tokens: SqlTokenStore, conn: Connection, clock: ManualClock, token_id: str, principal: str = "alice",
                **kw) -> str:
    """Add a user token for `principal` (created if new); return the principal id."""
    pid = await tokens.ensure_principal(conn, principal, "user", clock.now(), f"pr_{principal}")
    values = dict(label=None, token_hash="h" * 64, admin=False, kind="user") | kw
    await tokens.add_token(conn, token_id=token_id, principal_id=pid, now=clock.now(), **values)
    return pid


# ---------------------------------------------------------------- principals


async def test_ensure_principal_creates_a_name_once_and_returns_its_id_afterwards(db, tokens, clock):
    async with db.write() as conn:
        first = await tokens.ensure_principal(conn, "alice", "user", clock.now(), "pr_one")
        again = await tokens.ensure_principal(conn, "alice", "service", clock.now(), "pr_two")
        assert await tokens.principal_id(conn, "alice") == first == again == "pr_one"
        assert await tokens.principal_id(conn, "nobody") is None


async def test_ensure_principal_lets_a_concurrent_creators_row_win_and_the_transaction_goes_on(db, tokens, clock):
    async def first(conn: Connection) -> str:
        return await tokens.ensure_principal(conn, "carol", "user", clock.now(), "pr_first")

    async def second(conn: Connection) -> str:
        pid = await tokens.ensure_principal(conn, "carol", "user", clock.now(), "pr_second")
        await tokens.add_token(conn, token_id="tok_after", principal_id=pid, label=None, token_hash="h" * 64,
                               admin=False, kind="user", now=clock.now())
        return pid

    assert await race(db, first, second) == ("pr_first", "pr_first")
    async with db.read() as conn:
        assert (await tokens.token(conn, "tok_after")).principal_id == "pr_first"


async def test_principal_name_is_none_for_an_unknown_principal(db, tokens, clock):
    async with db.write() as conn:
        pid = await tokens.ensure_principal(conn, "alice", "user", clock.now(), "pr_a")
        assert await tokens.principal_name(conn, pid) == "alice"
        assert await tokens.principal_name(conn, "pr_missing") is None


# ---------------------------------------------------------------- tokens


async def test_a_token_is_stored_by_its_hash_with_its_kind_and_run(db, tokens, clock):
    async with db.write() as conn:
        await token(tokens, conn, clock, "tok_run", kind="run", task_id="tr_1", token_hash="a" * 64)
    async with db.read() as conn:
        row = await tokens.token(conn, "tok_run")
    assert (row.token_hash, row.kind, row.task_id, row.revoked_at) == ("a" * 64, "run", "tr_1", None)
    assert utc(row.created_at) == clock.now()


async def test_token_to_verify_carries_the_principal_name_and_the_runs_status(db, tokens, clock):
    async with db.write() as conn:
        pid = await token(tokens, conn, clock, "tok_run", kind="run", task_id="tr_live")
        await token(tokens, conn, clock, "tok_gone", kind="run", task_id="tr_missing")
        await conn.execute(task_runs.insert().values(id="tr_live", owner_id=pid, prompt="p", snapshot={},
                                                     status="running", created_at=clock.now()))
    async with db.read() as conn:
        live = await tokens.token_to_verify(conn, "tok_run")
        gone = await tokens.token_to_verify(conn, "tok_gone")
        assert await tokens.token_to_verify(conn, "tok_nope") is None
    assert (live.name, live.run_status, live.token_hash) == ("alice", "running", "h" * 64)
    assert gone.run_status is None


async def test_record_use_sets_last_used(db, tokens, clock):
    async with db.write() as conn:
        await token(tokens, conn, clock, "tok_a")
    clock.advance(90)
    async with db.write() as conn:
        await tokens.record_use(conn, "tok_a", clock.now())
        assert utc((await tokens.token(conn, "tok_a")).last_used_at) == clock.now()


async def test_list_tokens_is_oldest_first_per_principal_or_everyones_and_shows_no_hash(db, tokens, clock):
    async with db.write() as conn:
        await token(tokens, conn, clock, "tok_1", "alice")
        clock.advance(1)
        await token(tokens, conn, clock, "tok_2", "bob")
        clock.advance(1)
        pid = await token(tokens, conn, clock, "tok_3", "alice")
        await tokens.revoke_token(conn, "tok_3", clock.now())
    async with db.read() as conn:
        everyone = await tokens.list_tokens(conn, None, include_revoked=True)
        alices = await tokens.list_tokens(conn, pid, include_revoked=True)
        alices_live = await tokens.list_tokens(conn, pid, include_revoked=False)
    assert [(t.id, t.principal) for t in everyone] == [("tok_1", "alice"), ("tok_2", "bob"), ("tok_3", "alice")]
    assert [t.id for t in alices] == ["tok_1", "tok_3"] and [t.id for t in alices_live] == ["tok_1"]
    assert not any("hash" in key for key in everyone[0]._mapping)


async def test_revoke_token_revokes_once_and_the_first_revocation_time_stays(db, tokens, clock):
    async with db.write() as conn:
        await token(tokens, conn, clock, "tok_a")
        first = clock.now()
        assert await tokens.revoke_token(conn, "tok_a", first) is True
        assert await tokens.revoke_token(conn, "tok_a", first + timedelta(hours=1)) is False
        assert await tokens.revoke_token(conn, "tok_missing", first) is False
        assert utc((await tokens.token(conn, "tok_a")).revoked_at) == first


# ---------------------------------------------------------------- OAuth


async def client_and_code(db: Database, tokens: SqlTokenStore, oauth: SqlOAuthStore, clock: ManualClock,
                          code_hash: str = "c" * 64) -> str:
    """Register client oc_1 for alice and store an approved code; return alice's principal id."""
    async with db.write() as conn:
        pid = await tokens.ensure_principal(conn, "alice", "user", clock.now(), "pr_alice")
        await oauth.add_client(conn, client_id="oc_1", secret_hash="s" * 64, name="Claude",
                               redirect_uris=["http://127.0.0.1/cb"], scope="tasks leases", auth_method="none",
                               info={"client_name": "Claude"}, now=clock.now())
        await oauth.add_code(conn, code_hash=code_hash, client_id="oc_1", principal_id=pid,
                             redirect_uri="http://127.0.0.1/cb", redirect_explicit=True, code_challenge="x" * 43,
                             scope="tasks", resource=None, expires_at=clock.now() + timedelta(minutes=10),
                             now=clock.now())
    return pid


async def granted(db: Database, tokens: SqlTokenStore, oauth: SqlOAuthStore, clock: ManualClock) -> None:
    """Exchange the code for grant og_1 with access token a… and refresh token r…."""
    await client_and_code(db, tokens, oauth, clock)
    async with db.write() as conn:
        await oauth.grant_code(conn, await oauth.code_to_exchange(conn, "c" * 64), "og_1", clock.now())
        await oauth.add_token_pair(conn, "og_1", "tasks", access_hash="a" * 64,
                                   access_expires_at=clock.now() + timedelta(hours=1), refresh_hash="r" * 64,
                                   refresh_expires_at=clock.now() + timedelta(days=30), now=clock.now())


async def test_a_client_is_registered_with_its_secret_hash_only(db, tokens, oauth, clock):
    await client_and_code(db, tokens, oauth, clock)
    async with db.read() as conn:
        row = await oauth.client(conn, "oc_1")
        assert await oauth.client(conn, "oc_missing") is None
    assert (row.secret_hash, row.name, list(row.redirect_uris), row.scope) == (
        "s" * 64, "Claude", ["http://127.0.0.1/cb"], "tasks leases")


async def test_a_code_is_stored_unused_by_its_hash(db, tokens, oauth, clock):
    pid = await client_and_code(db, tokens, oauth, clock)
    async with db.write() as conn:
        row = await oauth.code_to_exchange(conn, "c" * 64)
        assert await oauth.code_to_exchange(conn, "d" * 64) is None
    assert (row.client_id, row.principal_id, row.used_at, row.grant_id) == ("oc_1", pid, None, None)
    assert utc(row.expires_at) == clock.now() + timedelta(minutes=10)


async def test_code_to_exchange_lets_one_of_two_concurrent_exchanges_find_the_code_unused(db, tokens, oauth, clock):
    await client_and_code(db, tokens, oauth, clock)

    async def exchange(conn: Connection) -> bool:
        row = await oauth.code_to_exchange(conn, "c" * 64)
        if row.used_at is not None:
            return False
        await oauth.spend_code(conn, row.code_hash, clock.now())
        return True

    assert await race(db, exchange, exchange) == (True, False)


async def test_grant_code_opens_the_grant_and_remembers_it_on_the_code(db, tokens, oauth, clock):
    pid = await client_and_code(db, tokens, oauth, clock)
    async with db.write() as conn:
        code = await oauth.code_to_exchange(conn, "c" * 64)
        await oauth.spend_code(conn, code.code_hash, clock.now())
        await oauth.grant_code(conn, code, "og_1", clock.now())
        after = await oauth.code_to_exchange(conn, "c" * 64)
        grant = (await conn.execute(sa.select(oauth_grants).where(oauth_grants.c.id == "og_1"))).one()
    assert after.grant_id == "og_1" and utc(after.used_at) == clock.now()
    assert (grant.client_id, grant.principal_id, grant.scope, grant.revoked_at) == ("oc_1", pid, "tasks", None)


async def test_access_token_resolves_an_access_hash_with_grant_principal_and_client_only(db, tokens, oauth, clock):
    await granted(db, tokens, oauth, clock)
    async with db.read() as conn:
        row = await oauth.access_token(conn, "a" * 64)
        assert await oauth.access_token(conn, "r" * 64) is None  # a refresh token never opens /mcp
        assert await oauth.access_token(conn, "z" * 64) is None
    assert (row.id, row.principal_id, row.name, row.client_name, row.scope) == (
        "og_1", "pr_alice", "alice", "Claude", "tasks")
    assert utc(row.expires_at) == clock.now() + timedelta(hours=1) and row.revoked_at is None


async def test_refresh_to_rotate_finds_refresh_tokens_only_with_their_grant(db, tokens, oauth, clock):
    await granted(db, tokens, oauth, clock)
    async with db.write() as conn:
        row = await oauth.refresh_to_rotate(conn, "r" * 64)
        assert await oauth.refresh_to_rotate(conn, "a" * 64) is None
    assert (row.grant_id, row.client_id, row.grant_scope, row.revoked_at, row.rotated_at) == (
        "og_1", "oc_1", "tasks", None, None)


async def test_refresh_to_rotate_lets_one_of_two_concurrent_rotations_find_the_token_unrotated(db, tokens, oauth,
                                                                                              clock):
    await granted(db, tokens, oauth, clock)

    async def rotation(conn: Connection) -> bool:
        row = await oauth.refresh_to_rotate(conn, "r" * 64)
        if row.rotated_at is not None:
            return False
        await oauth.rotate(conn, row.token_hash, clock.now())
        return True

    assert await race(db, rotation, rotation) == (True, False)


async def test_grant_of_names_the_grant_of_this_clients_tokens_only(db, tokens, oauth, clock):
    await granted(db, tokens, oauth, clock)
    async with db.read() as conn:
        assert await oauth.grant_of(conn, "a" * 64, "oc_1") == "og_1"
        assert await oauth.grant_of(conn, "r" * 64, "oc_1") == "og_1"
        assert await oauth.grant_of(conn, "a" * 64, "oc_other") is None


async def test_revoke_grant_keeps_the_first_time_and_reason(db, tokens, oauth, clock):
    await granted(db, tokens, oauth, clock)
    first = clock.now()
    async with db.write() as conn:
        await oauth.revoke_grant(conn, "og_1", first, "refresh token reused")
        await oauth.revoke_grant(conn, "og_1", first + timedelta(hours=1), "revoked by the client")
        grant = (await conn.execute(sa.select(oauth_grants).where(oauth_grants.c.id == "og_1"))).one()
        access = await oauth.access_token(conn, "a" * 64)
    assert (utc(grant.revoked_at), grant.revoked_reason) == (first, "refresh token reused")
    assert utc(access.revoked_at) == first  # every token of the grant reads as revoked


async def test_add_token_pair_stores_both_tokens_by_hash_with_their_expiries(db, tokens, oauth, clock):
    await granted(db, tokens, oauth, clock)
    async with db.read() as conn:
        rows = {r.kind: r for r in await conn.execute(sa.select(oauth_tokens))}
    assert {k: (r.token_hash, utc(r.expires_at)) for k, r in rows.items()} == {
        "access": ("a" * 64, clock.now() + timedelta(hours=1)),
        "refresh": ("r" * 64, clock.now() + timedelta(days=30))}


async def test_a_login_link_is_found_as_a_link_and_a_session_as_a_session(db, tokens, oauth, clock):
    async with db.write() as conn:
        pid = await tokens.ensure_principal(conn, "alice", "user", clock.now(), "pr_alice")
        await oauth.add_login(conn, "l" * 64, "link", pid, expires_at=clock.now() + timedelta(minutes=10),
                              now=clock.now())
        await oauth.add_login(conn, "s" * 64, "session", pid, expires_at=clock.now() + timedelta(hours=1),
                              now=clock.now())
        link = await oauth.link_to_redeem(conn, "l" * 64)
        assert await oauth.link_to_redeem(conn, "s" * 64) is None
        session = await oauth.session(conn, "s" * 64)
        assert await oauth.session(conn, "l" * 64) is None
    assert (link.principal_id, link.name, link.used_at) == (pid, "alice", None)
    assert (session.principal_id, session.name, utc(session.expires_at)) == (pid, "alice",
                                                                              clock.now() + timedelta(hours=1))


async def test_link_to_redeem_lets_one_of_two_concurrent_redemptions_spend_the_link(db, tokens, oauth, clock):
    async with db.write() as conn:
        pid = await tokens.ensure_principal(conn, "alice", "user", clock.now(), "pr_alice")
        await oauth.add_login(conn, "l" * 64, "link", pid, expires_at=clock.now() + timedelta(minutes=10),
                              now=clock.now())

    async def redeem(conn: Connection) -> bool:
        row = await oauth.link_to_redeem(conn, "l" * 64)
        if row.used_at is not None:
            return False
        await oauth.spend_login(conn, row.secret_hash, clock.now())
        return True

    assert await race(db, redeem, redeem) == (True, False)
    async with db.read() as conn:
        assert utc((await oauth.link_to_redeem(conn, "l" * 64)).used_at) == clock.now()

