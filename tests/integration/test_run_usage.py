"""Usage a runner reports (its usage events and its Finished message) keeps only known nonnegative integer metrics."""
from __future__ import annotations

from hub.services.tasks import SubmitRequest


async def test_a_runs_usage_events_and_its_final_usage_keep_only_known_metrics(hub):
    await hub.start_runner()
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    script = "usage input=3 bogus=7\nusage input=3 bogus=8\nusage bogus=9\nsay done"
    sub = await hub.hub.tasks.submit(admin, SubmitRequest(script, profile="scripted"))
    view = await hub.hub.tasks.wait_terminal(admin, sub["task_id"], timeout_s=20)
    assert view["status"] == "succeeded", view
    assert view["usage"] == {"input_tokens": 3}  # the Finished message's usage, not the raw report
    page = await hub.hub.tasks.events(admin, sub["task_id"])
    assert [e["usage"] for e in page["events"] if e["type"] == "usage"] == [{"input_tokens": 3}]
