"""Token kinds and lifecycle, and runtime ownership, on both stores."""
from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import sqlalchemy as sa

from hub.app import Hub
from hub.errors import Conflict, Forbidden, NotFound, Unauthorized
from hub.runner import protocol as p
from hub.services.auth.service import AuthService, TokenAdmin
from hub.services.tasks.dispatch import Link
from hub.domain.tasks import Status
from hub.services.tasks.service import SubmitRequest, finish_task
from hub.store.tables import api_tokens, runtimes
from tests.helpers import hub_settings, runner_outgoing

CAPS = {"platform": "linux", "engines": ["scripted"], "workspace_root": "/tmp", "workspace_writable": True}


@pytest.fixture
async def core(db, clock, tmp_path: Path):
    hub = Hub(hub_settings(db.url, tmp_path), db, clock)
    hub.admin = await hub.auth.authenticate(await hub.auth.create_token("admin", admin=True))
    hub.tokens = TokenAdmin(hub.auth)
    return hub


def reg(name: str = "gpu-box") -> p.Register:
    return p.Register(name=name, slots=2, capabilities=CAPS)


# ---------------------------------------------------------------- kinds


async def test_token_kinds_user_admin_runner_are_recorded_and_listed_without_hashes(core):
    await core.auth.create_token("alice", label="laptop")
    await core.auth.create_token("ops", admin=True, runner=True)
    listed = await core.tokens.list(core.admin, all_=True)
    kinds = {(t["principal"], t["kind"]) for t in listed}
    assert {("admin", "admin"), ("alice", "user"), ("ops", "runner")} <= kinds
    assert all(set(t) >= {"id", "kind", "label", "created", "last_used", "revoked"} for t in listed)
    assert not any("hash" in k or "secret" in k for t in listed for k in t)
    assert [t["shared"] for t in listed if t["kind"] == "runner"] == [True]


async def test_a_runner_token_is_refused_everywhere_but_the_runner_socket(core):
    token = await core.auth.create_token("ops", runner=True)
    with pytest.raises(Forbidden, match="runner token"):
        await core.auth.authenticate(token)
    runner = await core.auth.authenticate(token, surface="runner")
    assert runner.kind == "runner" and not runner.admin and not runner.shared


async def test_a_runner_token_made_by_an_admin_is_no_admin_token(core):
    runner = await core.auth.authenticate(await core.auth.create_token("ops", admin=True, runner=True),
                                          surface="runner")
    assert runner.shared and not runner.admin


async def test_a_user_lists_and_revokes_only_their_own_tokens(core):
    alice = await core.auth.authenticate(await core.auth.create_token("alice"))
    await core.auth.create_token("alice", label="second")
    bob_token = await core.auth.create_token("bob")
    bob = await core.auth.authenticate(bob_token)
    assert {t["principal"] for t in await core.tokens.list(alice)} == {"alice"}
    with pytest.raises(Forbidden):
        await core.tokens.list(alice, all_=True)
    with pytest.raises(NotFound):
        await core.tokens.revoke(alice, bob.token_id)
    await core.auth.authenticate(bob_token)  # untouched
    revoked = await core.tokens.revoke(alice, alice.token_id)
    assert revoked["revoked"] is not None


async def test_a_user_creates_tokens_only_for_themselves_and_never_admin_ones(core):
    alice = await core.auth.authenticate(await core.auth.create_token("alice"))
    with pytest.raises(Forbidden):
        await core.tokens.create(alice, "bob")
    with pytest.raises(Forbidden):
        await core.tokens.create(alice, admin=True)
    made = await core.tokens.create(alice, runner=True)
    assert made["kind"] == "runner" and made["principal"] == "alice" and not made["shared"]


async def test_an_admin_revokes_any_token_and_it_stops_at_once_here_and_within_the_cache_window_elsewhere(core, clock):
    token = await core.auth.create_token("alice")
    caller = await core.auth.authenticate(token)
    other_replica = AuthService(core.db, clock, cache_s=0.3)
    await other_replica.authenticate(token)  # cached there
    await core.tokens.revoke(core.admin, caller.token_id)
    with pytest.raises(Unauthorized):
        await core.auth.authenticate(token)
    await asyncio.sleep(0.35)
    with pytest.raises(Unauthorized):
        await other_replica.authenticate(token)


# ---------------------------------------------------------------- run tokens


async def dispatch_one(core, prompt: str = "say hi"):
    """Register a runtime, submit a task and take its dispatch; return (dispatch, runtime id, connection id)."""
    rt, conn_id, _ = await core.registry.register(core.admin, reg("rt"))
    await core.tasks.submit(core.admin, SubmitRequest(prompt=prompt, profile="scripted"))
    await core.dispatcher.place_once()
    out = await runner_outgoing(core.runner_dispatch, rt, conn_id, set())
    return out[0], rt, conn_id


async def test_a_run_token_is_scoped_to_the_runs_principal_and_stops_when_the_run_ends(core):
    d, rt, conn_id = await dispatch_one(core)
    token = d["env"]["AMUX_TOKEN"]
    child = await core.auth.authenticate(token)
    assert (child.kind, child.principal_id, child.task_id, child.admin) == ("run", core.admin.principal_id,
                                                                            d["task_id"], False)
    assert child.label == f"run:{d['task_id']}" and "AMUX_SESSION_ID" not in d["env"]
    with pytest.raises(Forbidden):
        await core.auth.authenticate(token, surface="runner")
    await core.reports.apply(rt, conn_id, [p.Accepted(task_id=d["task_id"], attempt=1),
                                           p.Finished(task_id=d["task_id"], attempt=1, rseq=1, outcome="succeeded")])
    with pytest.raises(Unauthorized):
        await core.auth.authenticate(token)
    with pytest.raises(Unauthorized):  # another replica, its own cache: the database says revoked
        await AuthService(core.db, core.clock).authenticate(token)


async def only_the_new_token_works(core, first: str, again: dict) -> None:
    """On a replica of its own (no cache): the run token sent first is revoked, the one sent again names the run."""
    with pytest.raises(Unauthorized):
        await AuthService(core.db, core.clock).authenticate(first)
    assert (await AuthService(core.db, core.clock).authenticate(again["env"]["AMUX_TOKEN"])).task_id == again["task_id"]


async def test_a_later_attempts_dispatch_revokes_the_token_of_the_earlier_attempt(core):
    d, rt, conn_id = await dispatch_one(core, "sleep 30")
    first = d["env"]["AMUX_TOKEN"]
    assert d["attempt"] == 1
    await core.auth.authenticate(first)
    core.clock.advance(core.settings.hub.reservation_ttl_s + 1)  # never accepted: requeued, dispatched again
    assert (await core.dispatcher.reap_once())["expired"] == 1
    await core.dispatcher.place_once()
    [again] = await runner_outgoing(core.runner_dispatch, rt, conn_id, set())

    assert (again["task_id"], again["attempt"]) == (d["task_id"], 2)
    await only_the_new_token_works(core, first, again)


async def test_a_dispatch_sent_again_to_a_runner_that_registered_again_revokes_the_token_sent_first(core):
    d, rt, _conn = await dispatch_one(core, "sleep 30")
    first = d["env"]["AMUX_TOKEN"]
    await core.auth.authenticate(first)
    _, conn_id, _ = await core.registry.register(core.admin, reg("rt"))  # it lost the dispatch: sent again
    [again] = await runner_outgoing(core.runner_dispatch, rt, conn_id, set())

    assert (again["task_id"], again["attempt"]) == (d["task_id"], 1)
    await only_the_new_token_works(core, first, again)


async def test_a_run_token_stops_when_its_run_ends_by_any_path(core):
    d, _rt, _conn = await dispatch_one(core, "sleep 30")
    token = d["env"]["AMUX_TOKEN"]
    await AuthService(core.db, core.clock).authenticate(token)
    async with core.db.write() as conn:  # e.g. the reaper failing a lost runtime's task: no runner report
        await finish_task(conn, d["task_id"], Status.FAILED, core.clock.now(), error="runtime lost")
    with pytest.raises(Unauthorized, match="ended with its run"):
        await AuthService(core.db, core.clock).authenticate(token)


async def test_a_token_list_never_shows_a_run_tokens_secret_and_names_its_run(core):
    d, _rt, _conn = await dispatch_one(core)
    run = [t for t in await core.tokens.list(core.admin) if t["kind"] == "run"]
    assert [t["task_id"] for t in run] == [d["task_id"]]


async def test_a_run_token_cannot_manage_tokens(core):
    d, _rt, _conn = await dispatch_one(core)
    child = await core.auth.authenticate(d["env"]["AMUX_TOKEN"])
    with pytest.raises(Forbidden):
        await core.tokens.list(child)
    with pytest.raises(Forbidden):
        await core.tokens.create(child)


# ---------------------------------------------------------------- revoked runners


async def test_a_revoked_runner_gets_no_dispatch(core):
    token = await core.auth.create_token("ops", admin=True, runner=True)
    runner = await core.auth.authenticate(token, surface="runner")
    rt, conn_id, _ = await core.registry.register(runner, reg("shared-rt"))
    await core.tokens.revoke(core.admin, runner.token_id)
    await core.tasks.submit(core.admin, SubmitRequest(prompt="say hi", profile="scripted"))
    await core.dispatcher.place_once()
    due = await core.runner_dispatch.outgoing_many([Link(runtime_id=rt, conn_id=conn_id, token_id=runner.token_id)])
    assert due.revoked == {conn_id} and not due.messages.get(conn_id)
    async with core.db.read() as conn:
        sent = (await conn.execute(sa.text("select count(*) from reservations where sent_at is not null"))).scalar()
    assert sent == 0


# ---------------------------------------------------------------- runtime ownership


async def test_a_runtime_name_owned_by_a_user_cannot_be_taken_by_another_user_or_the_admin(core):
    bob = await core.auth.authenticate(await core.auth.create_token("bob"))
    carol = await core.auth.authenticate(await core.auth.create_token("carol"))
    await core.registry.register(bob, reg())
    shared_runner = await core.auth.authenticate(await core.auth.create_token("ops", admin=True, runner=True),
                                                 surface="runner")
    for intruder in (carol, core.admin, shared_runner):
        with pytest.raises(Conflict, match="another --name.*deregister") as refused:
            await core.registry.register(intruder, reg())
        assert "'bob'" in refused.value.message
    async with core.db.read() as conn:
        row = (await conn.execute(sa.select(runtimes).where(runtimes.c.name == "gpu-box"))).one()
    assert row.principal_id == bob.principal_id and not row.shared


async def test_a_shared_runtime_is_registered_with_an_admins_runner_token(core):
    shared = await core.auth.authenticate(await core.auth.create_token("ops", admin=True, runner=True),
                                          surface="runner")
    personal = await core.auth.authenticate(await core.auth.create_token("dave", runner=True), surface="runner")
    await core.registry.register(shared, reg("pool-1"))
    await core.registry.register(personal, reg("dave-box"))
    async with core.db.read() as conn:
        rows = {r.name: r.shared for r in await conn.execute(sa.select(runtimes))}
    assert rows == {"pool-1": True, "dave-box": False}


async def test_the_owner_deregisters_a_stopped_runtime_and_frees_its_name(core):
    bob = await core.auth.authenticate(await core.auth.create_token("bob"))
    carol = await core.auth.authenticate(await core.auth.create_token("carol"))
    rt, conn_id, _ = await core.registry.register(bob, reg())
    with pytest.raises(Conflict, match="stop its runner"):
        await core.registry.deregister(bob, "gpu-box")
    await core.registry.disconnected(rt, conn_id)
    with pytest.raises(NotFound):
        await core.registry.deregister(carol, "gpu-box")
    await core.registry.deregister(bob, "gpu-box")
    await core.registry.register(carol, reg())


async def test_twenty_concurrent_registrations_of_one_runtime_name_by_two_users_leave_one_owner(core):
    users = [await core.auth.authenticate(await core.auth.create_token(n)) for n in ("bob", "carol")]
    results = await asyncio.gather(*(core.registry.register(users[i % 2], reg("contested")) for i in range(20)),
                                   return_exceptions=True)
    async with core.db.read() as conn:
        rows = (await conn.execute(sa.select(runtimes).where(runtimes.c.name == "contested"))).all()
    assert len(rows) == 1
    owner = rows[0].principal_id
    for i, r in enumerate(results):
        if users[i % 2].principal_id == owner:
            assert not isinstance(r, BaseException), r
        else:
            assert isinstance(r, Conflict), r


async def test_tokens_are_stored_only_as_hashes(core):
    token = await core.auth.create_token("alice")
    secret = token.split(".")[2]
    async with core.db.read() as conn:
        rows = (await conn.execute(sa.select(api_tokens))).all()
    assert not any(secret in str(tuple(r)) for r in rows)
