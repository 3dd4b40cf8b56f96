"""Upgrade recovery of schedule creators and legacy history — the same suite on SQLite and PostgreSQL.

The fixture database is in the pre-upgrade shape: schedules with a creator and a provenance receipt but no
creator binding and no application, identity bindings added later by the bot, ledger firings, incidents,
and pre-ledger submission records.
"""
from __future__ import annotations

import json
import uuid
from datetime import timedelta
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.script import ScriptDirectory

from bot.handlers.schedules import PAGE
from bot.identity import IdentityBindings
from hub.app import Hub
from hub.errors import NotFound
from hub.ids import new_id
from hub.store.db import Database, alembic_config, upgrade_sync
from hub.store.tables import (decisions, firings, identity_bindings, incidents, legacy_submissions, outbox,
                              recovery_results, recovery_runs, schedules, task_runs)
from tests.helpers import mcp_client, hub_settings
from tests.integration.test_cli_rest import amux

SNAPSHOT = (schedules, recovery_runs, recovery_results, incidents, decisions, outbox, task_runs, firings,
            identity_bindings)


async def principal_of(hub: Hub, name: str, kind: str = "user", label: str = "cli"):
    caller = await hub.auth.authenticate(await hub.auth.create_token(name, label=label, kind=kind))
    return caller


async def old_schedule(hub: Hub, caller, name: str, *, age_days: float = 30, kind: str = "subtask", **prov) -> str:
    """Insert a schedule as an older hub wrote it: frozen creator and receipt, no binding, no application."""
    now = hub.clock.now()
    sid = new_id("sch")
    receipt = {"source": "cli", "token_id": caller.token_id, "label": caller.label, "principal": caller.principal,
               **prov}
    async with hub.db.write() as conn:
        await conn.execute(schedules.insert().values(
            id=sid, creator_id=caller.principal_id, creator_binding_id=None, app_id=None, provenance=receipt, type=kind,
            session_ref="ses_x" if kind == "session-prompt" else None, name=name, prompt=f"run {name}",
            profile="scripted", rule="every 5m", timezone="UTC", paused=False,
            next_fire_at=now + timedelta(minutes=5), created_at=now - timedelta(days=age_days), updated_at=now))
    return sid


async def alias(hub: Hub, caller, app_id: str, status: str = "active") -> str:
    bid = new_id("bnd")
    async with hub.db.write() as conn:
        await conn.execute(identity_bindings.insert().values(
            id=bid, principal_id=caller.principal_id, app_id=app_id, open_id=f"ou_{uuid.uuid4().hex[:8]}",
            status=status, created_at=hub.clock.now() - timedelta(days=1)))
    return bid


async def firing(hub: Hub, sid: str, minutes_ago: float, task_id: str | None, outcome: str = "succeeded") -> str:
    fid = new_id("fir")
    t = hub.clock.now() - timedelta(minutes=minutes_ago)
    async with hub.db.write() as conn:
        await conn.execute(firings.insert().values(
            id=fid, schedule_id=sid, nominal_time=t, fired_at=t, admission="ok", task_id=task_id, outcome=outcome,
            missed_count=0, reconciled_at=t + timedelta(seconds=30), legacy=False))
    return fid


async def snapshot(db: Database) -> dict:
    async with db.read() as conn:
        return {t.name: sorted(tuple(str(v) for v in r) for r in (await conn.execute(sa.select(t))).all())
                for t in SNAPSHOT}


@pytest.fixture
async def seeded(db, clock, tmp_path: Path):
    """One pre-upgrade database holding every case of the issue."""
    hub = Hub(hub_settings(db.url, tmp_path), db, clock)
    c = {}
    c["alice"] = await principal_of(hub, "alice")
    c["bob"] = await principal_of(hub, "bob")
    c["carol"] = await principal_of(hub, "carol")
    c["svc"] = await principal_of(hub, "nightly-bot", kind="service")
    c["dave"] = await principal_of(hub, "dave")
    ids = {
        "clean": await old_schedule(hub, c["alice"], "clean"),
        "two_apps": await old_schedule(hub, c["bob"], "two-apps"),
        "revoked": await old_schedule(hub, c["carol"], "revoked"),
        "service": await old_schedule(hub, c["svc"], "service"),
        "owner": await old_schedule(hub, c["dave"], "owner", owner="erin"),
        "prompt": await old_schedule(hub, c["alice"], "prompt", kind="session-prompt"),
    }
    hub.binding = {"alice": await alias(hub, c["alice"], "cli_a")}
    await alias(hub, c["bob"], "cli_a")
    await alias(hub, c["bob"], "cli_b")
    await alias(hub, c["carol"], "cli_a", status="revoked")
    await alias(hub, c["svc"], "cli_a")
    await alias(hub, c["dave"], "cli_a")
    hub.callers, hub.ids = c, ids
    return hub


async def feishu_view(hub: Hub, app_id: str, open_id: str) -> list[str]:
    """The schedules the bot's personal list shows this Feishu user (none without an active alias)."""
    v = await IdentityBindings(hub.identity).find(app_id, open_id, None)
    if v is None:
        return []
    return [i.schedule_id for i in (await hub.schedules.page(v.caller(), 0, PAGE)).items]


def by_id(res: dict) -> dict:
    return {e["schedule_id"]: e for e in res["schedules"]}


async def row(db: Database, sid: str):
    async with db.read() as conn:
        return (await conn.execute(sa.select(schedules).where(schedules.c.id == sid))).first()


async def test_a_clean_single_alias_is_bound(seeded):
    res = by_id(await seeded.recovery.recover_creators())
    e = res[seeded.ids["clean"]]
    assert (e["outcome"], e["binding_id"], e["app_id"]) == ("bound", seeded.binding["alice"], "cli_a")
    r = await row(seeded.db, seeded.ids["clean"])
    assert (r.creator_binding_id, r.app_id, r.creator_id) == (seeded.binding["alice"], "cli_a",
                                                             seeded.callers["alice"].principal_id)


@pytest.mark.parametrize("case, reason", [
    ("two_apps", "ambiguous: 2 active Feishu aliases (applications cli_a, cli_b)"),
    ("revoked", "only revoked aliases"),
    ("service", "created by service principal"),
    ("owner", "owner mismatch: recorded owner 'erin'"),
])
async def test_ambiguous_or_missing_provenance_is_left_unbound_with_the_reason(seeded, case, reason):
    res = by_id(await seeded.recovery.recover_creators())
    e = res[seeded.ids[case]]
    assert e["outcome"] == "unbound" and reason in e["reason"] and e["binding_id"] is None
    r = await row(seeded.db, seeded.ids[case])
    assert r.creator_binding_id is None and r.app_id is None
    again = by_id(await seeded.recovery.recover_creators())[seeded.ids[case]]
    assert again["recorded"] and again["outcome"] == "unbound" and reason in again["reason"]  # reported again


async def test_session_prompt_schedules_are_out_of_scope(seeded):
    res = by_id(await seeded.recovery.recover_creators())
    assert res[seeded.ids["prompt"]]["outcome"] == "ignored"
    assert (await row(seeded.db, seeded.ids["prompt"])).creator_binding_id is None


async def test_a_schedule_created_after_the_cutoff_is_never_included(seeded):
    first = await seeded.recovery.recover_creators()
    seeded.clock.advance(3600)
    late = await old_schedule(seeded, seeded.callers["alice"], "late", age_days=0)
    second = await seeded.recovery.recover_creators()
    assert second["cutoff"] == first["cutoff"] and second["cutoff_recorded"]  # the first run's cutoff is reused
    e = by_id(second)[late]
    assert e["outcome"] == "ignored" and "after the upgrade cutoff" in e["reason"]
    assert (await row(seeded.db, late)).creator_binding_id is None
    async with seeded.db.read() as conn:
        assert (await conn.execute(sa.select(recovery_results)
                                   .where(recovery_results.c.schedule_id == late))).first() is None


async def test_running_recovery_twice_changes_nothing(seeded):
    first = await seeded.recovery.recover_creators()
    before = await snapshot(seeded.db)
    seeded.clock.advance(60)
    second = await seeded.recovery.recover_creators()
    assert await snapshot(seeded.db) == before
    assert second["run_id"] == first["run_id"]
    assert all(e["recorded"] for e in second["schedules"] if e["outcome"] != "ignored")
    strip = lambda res: {k: (v["outcome"], v["reason"], v["binding_id"]) for k, v in by_id(res).items()}  # noqa: E731
    assert strip(second) == strip(first)


async def test_a_binding_added_after_recovery_does_not_change_a_recorded_outcome(seeded):
    await seeded.recovery.recover_creators()
    # carol binds again later: her recorded outcome stays (new schedules bind themselves)
    async with seeded.db.write() as conn:
        await conn.execute(identity_bindings.update()
                           .where(identity_bindings.c.principal_id == seeded.callers["carol"].principal_id)
                           .values(status="active"))
    before = await snapshot(seeded.db)
    await seeded.recovery.recover_creators()
    assert await snapshot(seeded.db) == before


async def test_dry_run_writes_nothing(seeded):
    before = await snapshot(seeded.db)
    res = await seeded.recovery.recover_creators(dry_run=True)
    assert await snapshot(seeded.db) == before
    assert res["dry_run"] and res["run_id"] is None and not res["cutoff_recorded"]
    assert by_id(res)[seeded.ids["clean"]]["outcome"] == "bound" and res["counts"]["unbound"] == 4


async def test_recovery_hydrates_execution_state_without_replaying_tasks_or_notifications(seeded):
    hub, sid = seeded, seeded.ids["clean"]
    for i in range(3):
        await firing(hub, sid, 60 - i * 5, f"tr_old{i}", "failed")
    now = hub.clock.now()
    async with hub.db.write() as conn:  # an incident an older hub kept under a guessed application
        await conn.execute(incidents.insert().values(
            id="inc_old", schedule_id=sid, app_id="cli_guess", creator_id=None, kind="schedule", state="open",
            active_key=sid, failures=3, missed=0, unknowns=0, opened_at=now - timedelta(minutes=50), updated_at=now))
    await hub.recovery.recover_creators()
    async with hub.db.read() as conn:
        inc = (await conn.execute(sa.select(incidents).where(incidents.c.id == "inc_old"))).first()
        assert (inc.app_id, inc.creator_id) == ("cli_a", hub.callers["alice"].principal_id)
        assert (await conn.execute(sa.select(sa.func.count()).select_from(outbox))).scalar() == 0
        assert (await conn.execute(sa.select(sa.func.count()).select_from(task_runs))).scalar() == 0
        marked = (await conn.execute(sa.select(decisions.c.decision)
                                     .where(decisions.c.schedule_id == sid))).scalars().all()
    assert marked == ["recovered_history"] * 3
    # the alert pipeline's catch-up finds nothing to decide: past outcomes are never turned into notices
    await hub.alerts.catch_up()
    async with hub.db.read() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(outbox))).scalar() == 0


async def test_unbound_schedules_get_no_notifications_for_their_history(seeded):
    hub, sid = seeded, seeded.ids["two_apps"]
    await firing(hub, sid, 10, "tr_b", "failed")
    res = by_id(await hub.recovery.recover_creators())
    assert (res[sid]["outcome"], res[seeded.ids["clean"]]["outcome"]) == ("unbound", "bound")
    await hub.alerts.catch_up()
    async with hub.db.read() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(outbox))).scalar() == 0


async def test_recovered_schedules_appear_in_the_personal_view_and_reads_still_check_current_access(seeded):
    hub = seeded
    await hub.recovery.recover_creators()
    async with hub.db.read() as conn:
        open_id = (await conn.execute(sa.select(identity_bindings.c.open_id).where(
            identity_bindings.c.id == hub.binding["alice"]))).scalar()
    # The one schedule policy (hub/services/schedules/access.py): the application scope and an active binding are
    # needed, so alice's own schedule without a creator binding (the session-prompt recovery does not bind) is not
    # shown in Feishu at all.
    assert await feishu_view(hub, "cli_a", open_id) == [hub.ids["clean"]]
    assert await feishu_view(hub, "cli_b", open_id) == []  # another application's scope shows nothing
    # another principal still cannot read it; the creator still can (operator/CLI access is unchanged)
    with pytest.raises(NotFound):
        await hub.schedules.history(hub.callers["bob"], hub.ids["clean"])
    await hub.schedules.history(hub.callers["alice"], hub.ids["clean"])
    admin = await hub.auth.authenticate(await hub.auth.create_token("root", admin=True))
    await hub.identity.set_execution_access(admin, "alice", revoked=True)   # reads check current execution access
    assert await feishu_view(hub, "cli_a", open_id) == []
    await hub.identity.set_execution_access(admin, "alice", revoked=False)
    assert await feishu_view(hub, "cli_a", open_id) == [hub.ids["clean"]]
    async with hub.db.write() as conn:  # the alias is revoked after recovery: the binding grants nothing now
        await conn.execute(identity_bindings.update().where(identity_bindings.c.id == hub.binding["alice"])
                           .values(status="revoked"))
    assert await feishu_view(hub, "cli_a", open_id) == []


async def test_legacy_history_overlapping_ledger_firings_is_shown_once(db_url, tmp_path, clock):
    from tests.helpers import start_hub

    handle = await start_hub(db_url, tmp_path, clock)
    try:
        hub = handle.hub
        admin = await hub.auth.authenticate(handle.admin_token)
        sid = await old_schedule(hub, admin, "legacy")
        f1 = await firing(hub, sid, 20, "tr_one")
        f2 = await firing(hub, sid, 10, "tr_two")
        base = hub.clock.now()
        async with hub.db.write() as conn:
            await conn.execute(legacy_submissions.insert(), [
                {"id": "leg_1", "schedule_id": sid, "submitted_at": base - timedelta(minutes=20, seconds=2),
                 "task_id": "tr_one", "detail": {"status": "ok:task:tr_one"}},  # the same Task as ledger firing f1
                {"id": "leg_0", "schedule_id": sid, "submitted_at": base - timedelta(hours=2),
                 "task_id": "tr_zero", "detail": {"status": "ok:task:tr_zero"}},      # older than the ledger
                {"id": "leg_x", "schedule_id": sid, "submitted_at": base - timedelta(hours=3),
                 "task_id": None, "detail": {"status": "error"}}])                   # no Task recorded
        async with mcp_client(handle.url, handle.admin_token) as c:
            res = await c.call_tool("schedule_history", {"schedule_id": sid})
            assert not res.is_error, res
            page = res.structured_content["firings"]
            assert [f["firing_id"] for f in page] == [f2, f1, "leg_0", "leg_x"]
            assert [f["task_id"] for f in page].count("tr_one") == 1
            assert [(f["legacy"], f["outcome"]) for f in page] == [
                (False, "succeeded"), (False, "succeeded"), (True, "unconfirmed"), (True, "unconfirmed")]
            assert page[2]["receipt"] == "ok:task:tr_zero"
            two = (await c.call_tool("schedule_history",
                                     {"schedule_id": sid, "limit": 2, "cursor": 2})).structured_content
            assert [f["firing_id"] for f in two["firings"]] == ["leg_0", "leg_x"] and two["next_cursor"] is None
    finally:
        await handle.stop()


async def test_cli_recover_creators_dry_run_prints_each_schedule_as_json(sqlite_url, clock, tmp_path):
    db = Database(sqlite_url)
    try:
        hub = Hub(hub_settings(sqlite_url, tmp_path), db, clock)
        alice = await principal_of(hub, "alice")
        bob = await principal_of(hub, "bob")
        sa_ = await old_schedule(hub, alice, "mine")
        sb = await old_schedule(hub, bob, "ambiguous")
        await alias(hub, alice, "cli_a")
        await alias(hub, bob, "cli_a")
        await alias(hub, bob, "cli_b")
        before = await snapshot(db)
    finally:
        await db.close()
    code, out, err = await amux("db", "recover-creators", "--dry-run", "--json", "--db", sqlite_url,
                                env={"AMUX_HOME": str(tmp_path / "home")})
    assert code == 0, err
    res = json.loads(out)
    got = {e["schedule_id"]: (e["outcome"], e["reason"]) for e in res["schedules"]}
    assert got[sa_][0] == "bound" and got[sb][0] == "unbound" and "ambiguous" in got[sb][1]
    assert res["dry_run"] is True
    db = Database(sqlite_url)
    try:
        assert await snapshot(db) == before
    finally:
        await db.close()
    code, out, err = await amux("db", "recover-creators", "--dry-run", "--db", sqlite_url,
                                env={"AMUX_HOME": str(tmp_path / "home")})
    assert code == 0 and f"{sb}  'ambiguous' by bob: left unbound: ambiguous" in out, out + err


@pytest.mark.parametrize("backend", ["sqlite", "postgres"])
async def test_upgrade_heads_applies_recovery_on_a_database_already_at_the_previous_heads(databases, backend, tmp_path):
    if backend == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'prev.db'}"
    else:
        name = f"amux_prev_{uuid.uuid4().hex[:10]}"
        await databases._admin(f'CREATE DATABASE "{name}"')
        url = databases._url_for(name)
    try:
        cfg = alembic_config(url)
        script = ScriptDirectory.from_config(cfg)
        # The heads before the merge revision, with 0008_recovery not yet applied: its parents instead.
        merge = script.get_revision("0017_merge_heads")
        recovery = script.get_revision("0008_recovery")
        previous = (set(merge.down_revision) - {"0008_recovery"}) | set(recovery.down_revision)
        import asyncio
        for head in sorted(previous):
            await asyncio.to_thread(command.upgrade, cfg, head)
        db = Database(url)
        try:
            async with db.read() as conn:
                tables = await conn.run_sync(lambda c: sa.inspect(c).get_table_names())
            assert "schedules" in tables and "identity_bindings" in tables and "recovery_runs" not in tables
        finally:
            await db.close()
        await asyncio.to_thread(upgrade_sync, url)
        await asyncio.to_thread(upgrade_sync, url)  # already at heads: nothing to do
        db = Database(url)
        try:
            async with db.read() as conn:
                tables = await conn.run_sync(lambda c: sa.inspect(c).get_table_names())
                heads = set((await conn.execute(sa.text("select version_num from alembic_version"))).scalars())
        finally:
            await db.close()
        assert {"legacy_submissions", "recovery_runs", "recovery_results"} <= set(tables)
        assert heads == set(script.get_heads()) and len(heads) == 1  # one history, at its one head
    finally:
        if backend == "postgres":
            await databases.drop(url)


async def test_a_schedule_left_unbound_gets_no_proactive_notice_for_later_outcomes_either(seeded):
    hub, sid = seeded, seeded.ids["owner"]  # its creator has exactly one active alias, but the owner did not match
    assert by_id(await hub.recovery.recover_creators())[sid]["outcome"] == "unbound"
    hub.clock.advance(minutes=5)
    await firing(hub, sid, 1, "tr_later", "failed")  # an outcome after the upgrade
    assert await hub.alerts.catch_up() == 1
    hub.clock.advance(minutes=2)
    await hub.alerts.advance()
    async with hub.db.read() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(incidents).where(
            incidents.c.schedule_id == sid))).scalar() == 0
        assert (await conn.execute(sa.select(sa.func.count()).select_from(outbox))).scalar() == 0


async def test_the_cutoff_is_the_upgrades_time_the_migration_recorded_not_the_first_runs(seeded):
    from hub.store.tables import upgrade_marks
    async with seeded.db.read() as conn:   # the migration recorded its own time when it ran
        mark = (await conn.execute(sa.select(upgrade_marks.c.at)
                                   .where(upgrade_marks.c.name == "creator_recovery_cutoff"))).scalar()
    assert mark is not None
    upgraded_at = seeded.clock.now() - timedelta(days=2)   # the upgrade, in the test clock's time
    async with seeded.db.write() as conn:
        await conn.execute(upgrade_marks.update().where(upgrade_marks.c.name == "creator_recovery_cutoff")
                           .values(at=upgraded_at))
    after = await old_schedule(seeded, seeded.callers["alice"], "after-upgrade", age_days=1)  # before the first run
    res = await seeded.recovery.recover_creators()
    assert res["cutoff"] == upgraded_at.isoformat() and res["cutoff_source"] == "upgrade"
    e = by_id(res)[after]
    assert e["outcome"] == "ignored" and "after the upgrade cutoff" in e["reason"]
    assert by_id(res)[seeded.ids["clean"]]["outcome"] == "bound"   # made before the upgrade: recovered
    assert (await row(seeded.db, after)).creator_binding_id is None


async def test_cli_dry_run_on_a_schema_behind_says_so_and_upgrades_nothing(tmp_path):
    import asyncio
    url = f"sqlite+aiosqlite:///{tmp_path / 'behind.db'}"
    await asyncio.to_thread(upgrade_sync, url, "0022_manual_firings")
    env = {"AMUX_HOME": str(tmp_path / "home")}
    code, out, err = await amux("db", "recover-creators", "--dry-run", "--db", url, env=env)
    assert code == 3, (code, out, err)
    assert "schema is behind" in err and "0022_manual_firings" in err and "amux db upgrade" in err, err
    db = Database(url)
    try:
        async with db.read() as conn:
            assert set((await conn.execute(sa.text("select version_num from alembic_version"))).scalars()) == {
                "0022_manual_firings"}   # a dry run upgraded nothing
            tables = await conn.run_sync(lambda c: sa.inspect(c).get_table_names())
        assert "upgrade_marks" not in tables
    finally:
        await db.close()
    code, out, err = await amux("db", "recover-creators", "--db", url, "--json", env=env)   # a real run upgrades first
    assert code == 0 and json.loads(out)["cutoff_source"] == "upgrade", err
    code, out, err = await amux("db", "recover-creators", "--dry-run", "--db", url, env=env)   # now at head
    assert code == 0 and out.startswith("dry run: nothing written"), err
