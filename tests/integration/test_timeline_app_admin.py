"""An application's administrator reads the Agent Timeline of the runs its alert center shows them (a firing's Task
of a schedule with an incident in that application) on every door — REST, MCP and the bot's button — and nobody
else gains access: not another user of the application, not the administrator of another application, not an
administrator whose identity binding was revoked."""
from __future__ import annotations


from hub.store.tables import feishu_apps, identity_bindings
from tests.contract.store_rows import T0, firing, incident, schedule
from tests.helpers import mcp_client
from tests.integration.test_agent_timeline import get, run_task


async def bind(hub, name: str, app_id: str, open_id: str) -> tuple[str, str]:
    """A principal `name` with a token, bound in `app_id` as `open_id`; return (token, binding id)."""
    token = await hub.token(name)
    caller = await hub.hub.auth.authenticate(token)
    bid = f"idb_{name}_{app_id}"
    async with hub.hub.db.write() as conn:
        await conn.execute(identity_bindings.insert().values(id=bid, principal_id=caller.principal_id, app_id=app_id,
                                                             open_id=open_id, status="active", created_at=T0))
    return token, bid


async def test_an_apps_administrator_reads_the_timeline_of_a_run_its_alert_center_shows_and_nobody_else(hub):
    await hub.start_runner()
    alice = await hub.token("alice")
    task_id = await run_task(hub, alice)
    owner = await hub.hub.auth.authenticate(alice)
    async with hub.hub.db.write() as conn:  # alice's failing schedule in cli_x; its firing ran that Task
        for app_id, admin in (("cli_x", "ou_boss"), ("cli_y", "ou_other_boss")):
            await conn.execute(feishu_apps.insert().values(app_id=app_id, admin_open_id=admin, admin_epoch=1,
                                                           delivery_state="ok", timezone="UTC", updated_at=T0))
        await schedule(conn, "sch_nightly", owner.principal_id, app_id="cli_x")
        await firing(conn, "fir_1", "sch_nightly", 5, task_id=task_id, admission="ok", outcome="failed")
        await incident(conn, "inc_1", "sch_nightly", "cli_x", creator=owner.principal_id)
    boss, boss_binding = await bind(hub, "boss", "cli_x", "ou_boss")
    member, _ = await bind(hub, "member", "cli_x", "ou_member")          # a user of cli_x, not its administrator
    other_boss, _ = await bind(hub, "otherboss", "cli_y", "ou_other_boss")  # administers another application
    path = f"/api/v1/tasks/{task_id}/timeline"

    read = await get(hub.url, path, boss)
    assert read.status_code == 200 and read.json()["task_id"] == task_id, read.text
    async with mcp_client(hub.url, boss) as c:
        res = await c.call_tool("task_timeline", {"task_id": task_id})
        assert not res.is_error and res.structured_content["task_id"] == task_id
    for token in (member, other_boss):
        refused = await get(hub.url, path, token)
        assert refused.status_code == 404, refused.text
        async with mcp_client(hub.url, token) as c:
            assert (await c.call_tool("task_timeline", {"task_id": task_id})).is_error
    # a task of alice's that no alert center shows stays hers alone
    unrelated = await run_task(hub, alice)
    assert (await get(hub.url, f"/api/v1/tasks/{unrelated}/timeline", boss)).status_code == 404
    # the administrator's binding revoked: the access goes with it
    async with hub.hub.db.write() as conn:
        await conn.execute(identity_bindings.update().where(identity_bindings.c.id == boss_binding)
                           .values(status="revoked"))
    assert (await get(hub.url, path, boss)).status_code == 404


async def test_the_alert_centers_card_links_the_failing_runs_timeline(hub):
    from bot.cards.alert_center import render_alert_center
    from bot.cards.views import AlertCenterView, IncidentItem
    from bot.i18n import catalogs

    item = IncidentItem(incident_id="inc_1", schedule_name="nightly", creator="alice", state="open", failures=1,
                        missed=0, unknowns=0, last_outcome="failed", acknowledged=False, snoozed_until=None,
                        run_id="tr_1", run_kind="task")
    card = render_alert_center(AlertCenterView(app_id="cli_x", incidents=(item,), page=0, pages=1), catalogs())
    values = [str(b) for b in _buttons(card)]
    assert any("timeline" in v and "tr_1" in v for v in values), values


def _buttons(node):
    if isinstance(node, dict):
        if node.get("tag") == "button":
            yield node.get("behaviors") or node.get("value")
        for v in node.values():
            yield from _buttons(v)
    elif isinstance(node, list):
        for v in node:
            yield from _buttons(v)
