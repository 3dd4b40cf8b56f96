"""Usage a runner reports, through events and Finished, keeps only known nonnegative integer metrics of the run's own
attempt — on SQLite and PostgreSQL."""
from __future__ import annotations

from pathlib import Path

import pytest

from hub.app import Hub
from hub.runner import protocol as p
from hub.services.tasks.service import SubmitRequest
from tests.helpers import hub_settings, runner_outgoing

CAPS = {"platform": "linux", "engines": ["scripted"], "workspace_root": "/tmp", "workspace_writable": True,
        "memory_cli": True}
BOGUS = {"input_tokens": 10, "output_tokens": -1, "bogus": 7, "reasoning_tokens": True, "total_tokens": 3.5,
         "cached_input_tokens": "4"}


@pytest.fixture
async def run(db, clock, tmp_path: Path):
    """A hub's services over one database and a task dispatched to runtime r1 and accepted (attempt 1)."""
    hub = Hub(hub_settings(db.url, tmp_path), db, clock)
    hub.admin = await hub.auth.authenticate(await hub.auth.create_token("admin", admin=True))
    hub.rt, hub.conn_id, _ = await hub.registry.register(hub.admin, p.Register(name="r1", slots=1, capabilities=CAPS))
    hub.task_id = (await hub.tasks.submit(hub.admin, SubmitRequest(prompt="say hi", profile="scripted")))["task_id"]
    assert await hub.dispatcher.place_once() == 1
    await runner_outgoing(hub.runner_dispatch, hub.rt, hub.conn_id, set())
    await hub.reports.apply(hub.rt, hub.conn_id, [p.Accepted(task_id=hub.task_id, attempt=1)])
    return hub


def usage_event(rseq: int, usage: dict) -> p.Event:
    return p.Event(rseq=rseq, type="usage", payload={"usage": usage})


async def usage_events(hub) -> list[dict]:
    return [e["usage"] for e in (await hub.tasks.events(hub.admin, hub.task_id))["events"] if e["type"] == "usage"]


async def test_usage_events_keep_only_known_nonnegative_integer_metrics_and_one_with_none_is_dropped(run):
    await run.reports.apply(run.rt, run.conn_id, [p.Events(task_id=run.task_id, attempt=1, events=[
        usage_event(1, BOGUS), usage_event(2, {"bogus": 1, "output_tokens": -5})])])
    assert await usage_events(run) == [{"input_tokens": 10}]
    assert (await run.tasks.get(run.admin, run.task_id))["usage"] == {"input_tokens": 10}


async def test_finished_usage_keeps_only_known_nonnegative_integer_metrics(run):
    finished = p.Finished(task_id=run.task_id, attempt=1, rseq=1, outcome="succeeded",
                          usage={"input_tokens": 12, "output_tokens": -1, "bogus": 7})
    await run.reports.apply(run.rt, run.conn_id, [finished])
    assert (await run.tasks.get(run.admin, run.task_id))["usage"] == {"input_tokens": 12}


async def test_a_finished_with_no_known_metric_keeps_the_last_usage_event(run):
    await run.reports.apply(run.rt, run.conn_id, [
        p.Events(task_id=run.task_id, attempt=1, events=[usage_event(1, {"input_tokens": 5, "output_tokens": 2})]),
        p.Finished(task_id=run.task_id, attempt=1, rseq=2, outcome="succeeded",
                   usage={"bogus": 7, "output_tokens": -1})])
    assert (await run.tasks.get(run.admin, run.task_id))["usage"] == {"input_tokens": 5, "output_tokens": 2}


async def test_usage_reported_for_another_attempt_of_the_run_is_refused_and_changes_nothing(run):
    replies = await run.reports.apply(run.rt, run.conn_id, [
        p.Events(task_id=run.task_id, attempt=2, events=[usage_event(1, {"input_tokens": 99})]),
        p.Finished(task_id=run.task_id, attempt=2, rseq=2, outcome="succeeded", usage={"input_tokens": 99})])
    assert [r["drop"] for r in replies if r["type"] == "ack"] == [True, True]
    view = await run.tasks.get(run.admin, run.task_id)
    assert view["status"] == "running" and view["usage"] is None and await usage_events(run) == []
