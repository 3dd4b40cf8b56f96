"""SqlRecoveryStore: one test per rule its methods state — the same suite on SQLite and PostgreSQL."""
from __future__ import annotations


import pytest
import sqlalchemy as sa

from hub.store.db import Database
from hub.store.recovery import RecoveryResult, SqlRecoveryStore
from hub.store.tables import api_tokens, decisions, incidents, recovery_runs, schedules
from tests.contract import store_rows as r


@pytest.fixture
async def store(db: Database) -> SqlRecoveryStore:
    """A store over a database holding alice (aliases in cli_a and a revoked one in cli_b), bob (none) and carol
    (an alias in cli_b only)."""
    async with db.write() as conn:
        await r.principal(conn, "p_alice", "alice")
        await r.principal(conn, "p_bob", "bob")
        await r.principal(conn, "p_carol", "carol")
        await r.binding(conn, "ib_2", "p_alice", "cli_a")
        await r.binding(conn, "ib_1", "p_alice", "cli_b", status="revoked")
        await r.binding(conn, "ib_c", "p_carol", "cli_b")
    return SqlRecoveryStore(db)


def result(sid: str, outcome: str = "unbound", **kw) -> RecoveryResult:
    values = {"schedule_id": sid, "run_id": "rcv_1", "outcome": outcome, "reason": f"{outcome} because",
              "binding_id": None, "app_id": None, "creator_id": "p_alice", "recorded_at": r.at(1), **kw}
    return RecoveryResult(**values)


async def run(store: SqlRecoveryStore, run_id: str = "rcv_1", started: float = 0) -> None:
    async with store.db.write() as conn:
        await store.insert_run(conn, run_id, r.at(-1), r.at(started), {"bound": 1, "unbound": 0, "ignored": 0})


async def test_first_run_is_the_earliest_recorded_run_and_none_before_any(store):
    async with store.db.read() as conn:
        assert await store.first_run(conn) is None
    await run(store, "rcv_late", started=10)
    await run(store, "rcv_early", started=5)
    async with store.db.read() as conn:
        first = await store.first_run(conn)
    assert (first.id, r.utc(first.cutoff)) == ("rcv_early", r.at(-1))


async def test_insert_run_records_a_real_run_with_its_cutoff_and_counts(store):
    await run(store)
    async with store.db.read() as conn:
        row = (await conn.execute(sa.select(recovery_runs))).first()
    assert (row.id, row.dry_run, row.counts, r.utc(row.started_at), r.utc(row.finished_at)) == (
        "rcv_1", False, {"bound": 1, "unbound": 0, "ignored": 0}, r.at(0), r.at(0))


async def test_results_are_every_recorded_outcome_by_schedule(store):
    await run(store)
    async with store.db.write() as conn:
        await r.schedule(conn, "s1", "p_alice")
        await r.schedule(conn, "s2", "p_alice")
        await store.insert_result(conn, result("s1", "bound", binding_id="ib_2", app_id="cli_a"))
        await store.insert_result(conn, result("s2"))
    async with store.db.read() as conn:
        got = await store.results(conn)
    assert {k: (v.outcome, v.binding_id) for k, v in got.items()} == {"s1": ("bound", "ib_2"), "s2": ("unbound", None)}


async def test_insert_result_keeps_at_most_one_outcome_per_schedule(store):
    await run(store)
    async with store.db.write() as conn:
        await r.schedule(conn, "s1", "p_alice")
        await store.insert_result(conn, result("s1"))
    with pytest.raises(sa.exc.IntegrityError):
        async with store.db.write() as conn:
            await store.insert_result(conn, result("s1", "bound"))


async def test_every_schedule_includes_deleted_ones_oldest_first_with_ties_by_id(store):
    async with store.db.write() as conn:
        await r.schedule(conn, "s_b", "p_alice", created=1)
        await r.schedule(conn, "s_a", "p_alice", created=1, deleted_at=r.at(2))
        await r.schedule(conn, "s_old", "p_bob", created=0)
    async with store.db.read() as conn:
        assert [x.id for x in await store.every_schedule(conn)] == ["s_old", "s_a", "s_b"]


async def test_principals_tokens_and_bindings_are_read_by_id_whatever_their_status(store):
    async with store.db.write() as conn:
        await conn.execute(api_tokens.insert().values(id="tok_1", principal_id="p_alice", label="cli", token_hash="h",
                                                      admin=False, created_at=r.T0, revoked_at=r.at(1)))
    async with store.db.read() as conn:
        assert {k: v.name for k, v in (await store.principals(conn, {"p_alice", "p_gone"})).items()} == {
            "p_alice": "alice"}
        assert {k: v.principal_id for k, v in (await store.tokens(conn, {"tok_1", "tok_gone"})).items()} == {
            "tok_1": "p_alice"}
        bindings = await store.bindings_of(conn, {"p_alice", "p_bob"})
        assert await store.principals(conn, set()) == {} == await store.tokens(conn, set())
    assert {k: [(b.id, b.app_id, b.status) for b in v] for k, v in bindings.items()} == {
        "p_alice": [("ib_1", "cli_b", "revoked"), ("ib_2", "cli_a", "active")]}   # every application, id order


async def test_bind_freezes_binding_and_application_only_where_none_is_frozen_and_attributes_its_incidents(store):
    async with store.db.write() as conn:
        await r.schedule(conn, "s_free", "p_alice")
        await r.schedule(conn, "s_frozen", "p_alice", creator_binding_id="ib_old", app_id="cli_old")
        await r.incident(conn, "inc_1", "s_free", "cli_guess")
        await store.bind(conn, "s_free", "p_alice", "ib_2", "cli_a")
        await store.bind(conn, "s_frozen", "p_alice", "ib_2", "cli_a")
    async with store.db.read() as conn:
        got = {x.id: (x.creator_binding_id, x.app_id) for x in (await conn.execute(sa.select(schedules))).all()}
        inc = (await conn.execute(sa.select(incidents))).first()
    assert got == {"s_free": ("ib_2", "cli_a"), "s_frozen": ("ib_old", "cli_old")}
    assert (inc.app_id, inc.creator_id) == ("cli_a", "p_alice")


async def test_undecided_history_is_the_reconciled_firings_no_decision_covers_by_firing_and_missed_count(store):
    async with store.db.write() as conn:
        await r.schedule(conn, "s1", "p_alice")
        await r.firing(conn, "f_done", "s1", 0, admission="ok", outcome="failed", reconciled_at=r.at(1))
        await r.firing(conn, "f_decided", "s1", 5, admission="ok", outcome="failed", reconciled_at=r.at(6))
        await r.firing(conn, "f_grown", "s1", 10, admission="missed", outcome="missed", missed_count=3,
                       reconciled_at=r.at(11))
        await r.firing(conn, "f_open", "s1", 15, admission="ok")
        await store.insert_decisions(conn, [
            {"id": f"dec_{key}", "at": r.T0, "ingest_key": key, "firing_id": key.split(":")[0], "schedule_id": "s1",
             "incident_id": None, "notice_id": None, "outcome": "x", "decision": "notified", "detail": None}
            for key in ("f_decided:0", "f_grown:2")])   # the missed row grew since its decision
    async with store.db.read() as conn:
        rows = await store.undecided_history(conn, "s1")
    assert sorted((x.id, x.missed_count) for x in rows) == [("f_done", 0), ("f_grown", 3)]


async def test_insert_decisions_writes_the_rows_given(store):
    async with store.db.write() as conn:
        await store.insert_decisions(conn, [{"id": "dec_1", "at": r.T0, "ingest_key": "f1:0", "firing_id": "f1",
                                             "schedule_id": "s1", "incident_id": None, "notice_id": None,
                                             "outcome": "failed", "decision": "recovered_history", "detail": "d"}])
        await store.insert_decisions(conn, [])
    async with store.db.read() as conn:
        assert [(x.ingest_key, x.decision) for x in (await conn.execute(sa.select(decisions))).all()] == [
            ("f1:0", "recovered_history")]
