"""Memory scopes on both stores (seed: child Sessions use the Hub memory model)."""
from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from hub.app import Hub
from hub.config_sources import load_settings
from hub.errors import Conflict
from hub.runner import protocol as p
from hub.store.tables import sessions, task_events
from tests.helpers import hub_settings, runner_outgoing

CAPS = {"platform": "linux", "engines": ["scripted", "claude"], "workspace_root": "/tmp", "workspace_writable": True}


async def make_hub(db, clock, tmp_path: Path, *, user_isolation: bool | None = None) -> Hub:
    settings = hub_settings(db.url, tmp_path)
    if user_isolation is not None:
        settings.memory.user_isolation = user_isolation
    hub = Hub(settings, db, clock)
    hub.admin = await hub.auth.authenticate(await hub.auth.create_token("admin", admin=True))
    return hub


@pytest.fixture
async def core(db, clock, tmp_path: Path):
    """A hub with the shipped memory settings (per-principal memory)."""
    return await make_hub(db, clock, tmp_path)


@pytest.fixture
async def shared(db, clock, tmp_path: Path):
    """A hub whose operator chose one global memory (`memory.user_isolation = false`)."""
    return await make_hub(db, clock, tmp_path, user_isolation=False)


def test_memory_is_per_principal_by_default_and_global_memory_is_an_explicit_setting():
    assert load_settings(env={}).memory.user_isolation is True
    assert load_settings(env={"AMUX_MEMORY__USER_ISOLATION": "false"}).memory.user_isolation is False


async def launch_first_run(hub, caps, profile="scripted"):
    """Create a session, queue a turn, hand it to a runtime with `caps`; return (session id, turn id, child caller)."""
    rt, conn_id, _ = await hub.registry.register(hub.admin, p.Register(name="rt", slots=2, capabilities=caps))
    sid = (await hub.sessions.create(hub.admin, profile=profile))["session_id"]
    turn = await hub.sessions.submit_turn(hub.admin, sid, "say hi")
    await hub.dispatcher.place_once()
    out = await runner_outgoing(hub.runner_dispatch, rt, conn_id, set())
    child = await hub.auth.authenticate(out[0]["env"]["AMUX_TOKEN"])
    return sid, turn, child, (rt, conn_id)


async def stored_scope(hub, sid):
    async with hub.db.read() as conn:
        return (await conn.execute(sa.select(sessions.c.memory_scope).where(sessions.c.id == sid))).scalar()


async def test_a_fresh_child_stores_its_scope_precondition_independently_of_its_profile(core):
    await core.registry.register(core.admin, p.Register(name="rt", slots=1, capabilities=CAPS))
    a = (await core.sessions.create(core.admin, profile="scripted"))["session_id"]
    b = (await core.sessions.create(core.admin, profile="claude"))["session_id"]
    assert await stored_scope(core, a) == await stored_scope(core, b) == f"pending:principal:{core.admin.principal_id}"


async def test_by_default_a_childs_memory_is_its_principals_and_another_principal_never_sees_it(core):
    sid, _, child, _ = await launch_first_run(core, {**CAPS, "memory_cli": True})
    assert (await core.memory.set(child, "plan", "ship it"))["scope"] == f"principal:{core.admin.principal_id}"
    other = await core.auth.authenticate(await core.auth.create_token("svc", kind="service"))
    with pytest.raises(Exception, match="no memory"):
        await core.memory.get(other, "plan")


async def test_with_user_isolation_off_all_runtimes_share_global_memory(shared):
    sid, _, child, _ = await launch_first_run(shared, {**CAPS, "memory_cli": True})
    await shared.memory.set(child, "plan", "ship it")
    other = await shared.auth.authenticate(await shared.auth.create_token("svc", kind="service"))
    assert (await shared.memory.get(other, "plan"))["scope"] == "global"


async def test_a_service_execution_uses_the_service_principals_memory(core):
    svc = await core.auth.authenticate(await core.auth.create_token("svc", kind="service"))
    await core.memory.set(svc, "k", "service value")
    assert (await core.memory.get(svc, "k"))["scope"] == f"principal:{svc.principal_id}"
    with pytest.raises(Exception, match="no memory"):
        await core.memory.get(core.admin, "k")


async def test_existing_child_threads_keep_their_binding_on_resume(shared):
    sid, _, child, (rt, conn_id) = await launch_first_run(shared, {**CAPS, "memory_cli": True})
    assert await stored_scope(shared, sid) == "global"
    shared.memory.settings.user_isolation = True  # a later setting change does not rebind the existing thread
    shared.sessions.user_isolation = True
    await shared.sessions.submit_turn(shared.admin, sid, "say again")
    assert await stored_scope(shared, sid) == "global"
    assert (await shared.memory.set(child, "k", "v"))["scope"] == "global"


async def test_failed_capability_discovery_warns_and_leaves_the_conversation_without_memory(core):
    sid, turn, child, _ = await launch_first_run(core, {**CAPS, "memory_cli": False})
    assert await stored_scope(core, sid) == "none"
    async with core.db.read() as conn:
        kinds = [r.type for r in await conn.execute(sa.select(task_events.c.type).where(task_events.c.task_id == turn))]
    assert kinds == ["warning"]
    with pytest.raises(Conflict, match="no global fallback"):
        await core.memory.set(child, "k", "v")
    assert (await core.memory.list(core.admin))["keys"] == []  # nothing leaked into global memory


async def test_a_persistent_instance_cannot_change_its_effective_principal(core):
    await core.registry.register(core.admin, p.Register(name="rt", slots=1, capabilities=CAPS))
    alice = await core.auth.authenticate(await core.auth.create_token("alice"))
    iid = (await core.instances.create(alice, profile="scripted"))["instance_id"]
    with pytest.raises(Conflict, match="cannot change its effective principal"):
        await core.instances.followup(core.admin, iid, "say hijack")
