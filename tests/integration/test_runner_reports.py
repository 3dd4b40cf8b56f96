"""What a runner reports of a run: usage keeps only known metrics; a timeout names what the engine was doing."""
from __future__ import annotations

import asyncio
import json

from hub.clock import ManualClock
from hub.engines.claude import ClaudeEngine
from hub.runner.agent import Runner
from hub.services.tasks.service import SubmitRequest
from tests.helpers import PROCESS_MODE, REPO, eventually, started


async def test_a_runs_usage_events_and_its_final_usage_keep_only_known_metrics(hub):
    await hub.start_runner()
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    script = "usage input=3 bogus=7\nusage input=3 bogus=8\nusage bogus=9\nsay done"
    sub = await hub.hub.tasks.submit(admin, SubmitRequest(prompt=script, profile="scripted"))
    view = await hub.hub.tasks.wait_terminal(admin, sub["task_id"], timeout_s=20)
    assert view["status"] == "succeeded", view
    assert view["usage"] == {"input_tokens": 3}  # the Finished message's usage, not the raw report
    page = await hub.hub.tasks.events(admin, sub["task_id"])
    assert [e["usage"] for e in page["events"] if e["type"] == "usage"] == [{"input_tokens": 3}]


async def test_a_run_that_times_out_while_its_engine_retries_names_the_last_status(hub, tmp_path, monkeypatch):
    monkeypatch.setenv("AMUX_CLAUDE_BIN", str(REPO / "tests" / "fakes" / "bin" / "claude"))
    runner = Runner(hub.url, hub.admin_token, name="claude-host", slots=1,
                    **PROCESS_MODE, workspace_root=tmp_path / "ws",
                    engines={"claude": ClaudeEngine()})
    hub.runners.append((runner, asyncio.create_task(runner.run_forever())))
    await started(runner.registered.wait(), "the runner to register")
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    await hub.hub.credentials.declare(admin, "fake", ["FAKE_SCENARIO"])
    await hub.hub.credentials.set_value(admin, "fake", "FAKE_SCENARIO", "api-retry-slow")
    sub = await hub.hub.tasks.submit(admin, SubmitRequest(prompt="say hi", profile="claude", credential_profile="fake",
                                                          timeout_s=3))
    view = await hub.hub.tasks.wait_terminal(admin, sub["task_id"], timeout_s=30)
    assert (view["status"], view["error"]) == (
        "timed_out", "timed out after 3 s; last status: engine retrying: attempt 2 of 10 (connection error)"), view
    page = await hub.hub.tasks.events(admin, sub["task_id"])
    statuses = [(e["text"], e["retry"]) for e in page["events"] if e["type"] == "status"]
    assert statuses == [
        ("engine retrying: attempt 1 of 10 (connection error)",
         {"attempt": 1, "max_retries": 10, "cause": "connection error"}),
        ("engine retrying: attempt 2 of 10 (connection error)",
         {"attempt": 2, "max_retries": 10, "cause": "connection error"})], json.dumps(statuses)


async def test_a_silent_engine_gets_a_status_event_after_the_stall_time_and_its_timeout_says_it_stalled(
        hub, tmp_path, monkeypatch):
    monkeypatch.setenv("AMUX_CLAUDE_BIN", str(REPO / "tests" / "fakes" / "bin" / "claude"))
    silence = ManualClock()  # the runner's own: advancing the hub's would make the hub lose the runtime
    runner = Runner(hub.url, hub.admin_token, name="claude-host", slots=1, **PROCESS_MODE,
                    workspace_root=tmp_path / "ws", engines={"claude": ClaudeEngine()},
                    stall_notice_s=300, clock=silence)
    hub.runners.append((runner, asyncio.create_task(runner.run_forever())))
    await started(runner.registered.wait(), "the runner to register")
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    record = tmp_path / "record"
    record.mkdir()
    await hub.hub.credentials.declare(admin, "fake", ["FAKE_SCENARIO", "FAKE_RECORD_DIR"])
    await hub.hub.credentials.set_value(admin, "fake", "FAKE_SCENARIO", "silent")  # a real process that prints nothing
    await hub.hub.credentials.set_value(admin, "fake", "FAKE_RECORD_DIR", str(record))
    sub = await hub.hub.tasks.submit(admin, SubmitRequest(prompt="say hi", profile="claude", credential_profile="fake",
                                                          timeout_s=8))

    async def statuses() -> list[str]:
        page = await hub.hub.tasks.events(admin, sub["task_id"])
        return [e["text"] for e in page["events"] if e["type"] == "status"]

    await eventually(lambda: _exists(record / "stdin.jsonl"), timeout=30)  # the CLI runs and has its prompt
    silence.advance(299)
    await asyncio.sleep(1.2)  # longer than the watcher's poll: under the stall time nothing is said
    assert await statuses() == []
    silence.advance(2)
    assert await eventually(statuses) == ["no output from claude for 5 min"]
    silence.advance(300)
    await eventually(lambda: _has(statuses, "no output from claude for 10 min"))
    view = await hub.hub.tasks.wait_terminal(admin, sub["task_id"], timeout_s=30)
    assert (view["status"], view["error"]) == (
        "timed_out", "timed out after 8 s; the engine stalled: no output from claude for 10 min"), view


async def _exists(path):
    return path.exists()


async def _has(read, text):
    return text in await read()
