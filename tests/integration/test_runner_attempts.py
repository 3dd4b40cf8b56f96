"""A runner applies a cancel, a permission answer or a correction only to the attempt it names: one for an earlier
attempt of the same task leaves the attempt it runs now alone (the hub names the attempt in each)."""
from __future__ import annotations

import asyncio
from pathlib import Path

from hub.runner import protocol as p
from hub.services.tasks.admission import SubmitRequest
from tests.helpers import start_hub, started


async def test_a_cancel_for_another_attempt_leaves_the_running_attempt_alone(sqlite_url, tmp_path: Path, clock):
    hub = await start_hub(sqlite_url, tmp_path / "home", clock)
    try:
        runner = await hub.start_runner("r1", slots=1)
        admin = await hub.hub.auth.authenticate(hub.admin_token)
        sub = await hub.hub.tasks.submit(admin, SubmitRequest(prompt="sleep 600", profile="scripted"))

        async def running() -> bool:
            return (await hub.hub.tasks.get(admin, sub["task_id"])).status == "running"

        await started(running, "the task to run", timeout=30)
        held = runner.held[sub["task_id"]]
        await runner._on_message(p.Cancel(task_id=sub["task_id"], attempt=held.attempt + 1).model_dump())
        await runner._on_message(p.Steer(task_id=sub["task_id"], steer_id="st_x", text="hi",
                                         attempt=held.attempt + 1).model_dump())
        await asyncio.sleep(0.2)
        assert not held.cancel_intent and not held.task.done()  # another attempt's cancel: not this one
        answer = await hub.hub.tasks.cancel(admin, sub["task_id"])
        assert answer["attempt"] == held.attempt
        view = await hub.hub.tasks.wait_terminal(admin, sub["task_id"], timeout_s=30)
        assert view.status == "cancelled", view
    finally:
        await hub.stop()
