"""Placement checks platform and workspace access for every task, named runtime or not, with real runners over the
runner WebSocket; a task no online runtime can take says why it waits (task_get.waiting_for over MCP)."""
from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from hub.engines.scripted import ScriptedEngine
from hub.runner.agent import Runner
from tests.helpers import PROCESS_MODE, mcp_client, start_hub, started


class ReportingRunner(Runner):
    """A real runner that reports other capabilities than this machine's (a Windows box, a read-only workspace)."""

    def __init__(self, *args: Any, report: dict[str, Any], **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.report = report

    def capabilities(self) -> dict[str, Any]:
        """Describe this machine, overridden by what the test reports."""
        return {**super().capabilities(), **self.report}


@pytest.fixture
async def quiet_hub(sqlite_url: str, tmp_path: Path, clock):  # noqa: ANN001
    """A hub without its loops: the test runs each placement pass."""
    handle = await start_hub(sqlite_url, tmp_path, clock, background=False)
    yield handle
    await handle.stop()


async def start(hub, name: str, **report: Any) -> Runner:  # noqa: ANN001
    runner = ReportingRunner(hub.url, hub.admin_token, name=name, slots=2, report=report,
                             **PROCESS_MODE, workspace_root=Path(hub.hub.settings.home) / "ws" / name,
                             engines={"scripted": ScriptedEngine()})
    hub.runners.append((runner, asyncio.create_task(runner.run_forever())))
    await started(runner.registered.wait(), "the runner to register")
    return runner


async def test_a_task_naming_no_runtime_never_lands_on_windows_or_an_unwritable_workspace_and_says_why(quiet_hub):
    hub = quiet_hub
    await start(hub, "win", platform="windows")
    async with mcp_client(hub.url, hub.admin_token) as c:
        refused = await c.call_tool("task_submit", {"prompt": "say hi", "profile": "scripted"})
        assert refused.is_error and "win runs on windows" in refused.content[0].text
        await start(hub, "ro", workspace_writable=False)
        sub = await c.call_tool("task_submit", {"prompt": "say hi", "profile": "scripted"})
        assert not sub.is_error, sub.content[0].text
        task_id = sub.structured_content["task_id"]
        assert await hub.hub.dispatcher.place_once() == 0
        view = (await c.call_tool("task_get", {"task_id": task_id})).structured_content
        assert view["status"] == "queued" and view["runtime"] is None
        assert "none can take it" in view["waiting_for"] and "win runs on windows" in view["waiting_for"]
        assert "ro cannot write its workspace root" in view["waiting_for"]
        await start(hub, "lin")
        assert await hub.hub.dispatcher.place_once() == 1
        await hub.hub.tasks.wait_terminal(await hub.hub.auth.authenticate(hub.admin_token), task_id, timeout_s=20)
        view = (await c.call_tool("task_get", {"task_id": task_id})).structured_content
    assert view["status"] == "succeeded" and view["runtime"] == "lin" and view["waiting_for"] is None


async def test_a_task_naming_a_windows_runtime_is_refused_and_one_pinned_to_an_unfit_runtime_says_it_never_can(
        quiet_hub):
    hub = quiet_hub
    await start(hub, "win", platform="windows")
    await start(hub, "ro", workspace_writable=False)
    async with mcp_client(hub.url, hub.admin_token) as c:
        res = await c.call_tool("task_submit", {"prompt": "say hi", "profile": "scripted", "runtime": "win"})
        assert res.is_error and "pick a linux or macOS runtime" in res.content[0].text
        res = await c.call_tool("task_submit", {"prompt": "say hi", "profile": "scripted", "runtime": "ro"})
        assert res.is_error and "cannot write its workspace root" in res.content[0].text
