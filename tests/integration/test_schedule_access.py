"""One authorization policy (hub/services/schedules/access.py): the bot's personal views and card actions and the
REST/MCP schedule reads make the same decision, table-driven over one set of schedules.
"""
from __future__ import annotations

from bot.handlers.schedules import PAGE
from bot.identity import Viewer
from hub.ids import new_id
from hub.services.auth.service import Caller
from hub.store.tables import identity_bindings, schedules

APP_A, APP_B = "cli_a", "cli_b"


async def _setup(hub):
    """carol (linked in A and B), dave (linked in A); schedules covering every rule."""
    carol = await hub.auth.authenticate(await hub.auth.create_token("carol"))
    dave = await hub.auth.authenticate(await hub.auth.create_token("dave"))
    now = hub.clock.now()
    ids = {"carol_a": new_id("ib"), "carol_b": new_id("ib"), "carol_old": new_id("ib"), "dave_a": new_id("ib")}
    async with hub.db.write() as conn:
        for key, principal, app, status in (("carol_a", carol, APP_A, "active"), ("carol_b", carol, APP_B, "active"),
                                            ("carol_old", carol, APP_A, "revoked"), ("dave_a", dave, APP_A, "active")):
            await conn.execute(identity_bindings.insert().values(
                id=ids[key], principal_id=principal.principal_id, app_id=app, open_id=f"ou_{key}", status=status,
                created_at=now))
        rows = {  # name: (creator, app_id, creator binding)
            "frozen_a": (carol, APP_A, ids["carol_a"]),
            "frozen_b": (carol, APP_B, ids["carol_b"]),
            "unbound": (carol, None, None),                  # made over MCP/CLI before any link
            "old_binding": (carol, APP_A, ids["carol_old"]),  # its creator binding was unlinked since
            "daves": (dave, APP_A, ids["dave_a"]),
        }
        for name, (creator, app, binding) in rows.items():
            await conn.execute(schedules.insert().values(
                id=f"sch_{name}", creator_id=creator.principal_id, creator_binding_id=binding, app_id=app,
                provenance={"source": "test"}, type="subtask", name=name, prompt="say hi", rule="every 1h",
                timezone="UTC", paused=False, created_at=now, updated_at=now))
    viewers = {
        "carol_a": Viewer(app_id=APP_A, open_id="ou_carol_a", principal_id=carol.principal_id, name="carol",
                          binding_id=ids["carol_a"], is_admin=False),
        "carol_b": Viewer(app_id=APP_B, open_id="ou_carol_b", principal_id=carol.principal_id, name="carol",
                          binding_id=ids["carol_b"], is_admin=False),
        "dave_a": Viewer(app_id=APP_A, open_id="ou_dave_a", principal_id=dave.principal_id, name="dave",
                         binding_id=ids["dave_a"], is_admin=False),
    }
    return carol, dave, viewers


async def _bot_view(hub, v: Viewer) -> set[str]:
    """Every page of the bot's personal list (the service call its card makes)."""
    names, page = set(), 0
    while True:
        p = await hub.schedules.page(v.caller(), page, PAGE)
        names |= {i.name for i in p.items}
        if page + 1 >= p.pages:
            return names
        page += 1


async def _readable(read) -> bool:
    try:
        await read
        return True
    except Exception:  # NotFound: "does not exist or is not yours"
        return False


async def _rest_view(hub, caller: Caller) -> set[str]:
    return {s["name"] for s in await hub.schedules.list(caller)}


EXPECTED = {
    "carol_a": {"frozen_a"},     # not B's, not an unbound one, not one whose creator binding was unlinked, not dave's
    "carol_b": {"frozen_b"},
    "dave_a": {"daves"},
}


async def test_personal_views_card_actions_and_rest_reads_make_the_same_decision(hub):
    hub = hub.hub
    _carol, _dave, viewers = await _setup(hub)
    for key, v in viewers.items():
        bot, rest = await _bot_view(hub, v), await _rest_view(hub, v.caller())
        assert bot == rest == EXPECTED[key], key
        for name in {"frozen_a", "frozen_b", "unbound", "old_binding", "daves"}:   # single reads agree with lists
            readable = await _readable(hub.schedules.get(v.caller(), f"sch_{name}"))
            assert readable == (name in EXPECTED[key]), (key, name)
            card = await _readable(hub.schedules.card(v.caller(), f"sch_{name}"))   # the bot's detail and controls
            assert card == (name in EXPECTED[key]), (key, name)


async def test_a_schedule_without_application_scope_and_creator_binding_is_shown_in_no_feishu_app(any_hub):
    hub = any_hub.hub
    _carol, _dave, viewers = await _setup(hub)
    for v in viewers.values():
        assert "unbound" not in await _bot_view(hub, v)
        assert not await _readable(hub.schedules.card(v.caller(), "sch_unbound"))


async def test_a_schedule_recovery_left_unbound_is_not_shown_in_any_app_even_to_its_linked_creator(any_hub):
    hub = any_hub
    h = hub.hub
    carol = await h.auth.authenticate(await h.auth.create_token("carol"))
    now = h.clock.now()
    async with h.db.write() as conn:   # the pre-upgrade shape: a receipt, no binding, no application
        for app in (APP_A, APP_B):   # two active aliases: ambiguous, left unbound
            await conn.execute(identity_bindings.insert().values(
                id=new_id("ib"), principal_id=carol.principal_id, app_id=app, open_id=f"ou_c_{app}",
                status="active", created_at=now))
        await conn.execute(schedules.insert().values(
            id="sch_left", creator_id=carol.principal_id, provenance={"source": "cli", "token_id": carol.token_id,
                                                                      "label": "cli", "principal": "carol"},
            type="subtask", name="left", prompt="say hi", rule="every 1h", timezone="UTC", paused=False,
            created_at=now, updated_at=now))
    res = await h.recovery.recover_creators()
    assert {e["schedule_id"]: e["outcome"] for e in res["schedules"]}["sch_left"] == "unbound"
    for app in (APP_A, APP_B):
        b = await h.identity.find_contact(app, f"ou_c_{app}")
        v = Viewer(app_id=app, open_id=f"ou_c_{app}", principal_id=carol.principal_id, name="carol",
                   binding_id=b.binding_id, is_admin=False)
        assert await _bot_view(h, v) == set()
    assert "left" in await _rest_view(h, carol)   # the operator/CLI view is unchanged


async def test_revoking_a_principals_execution_access_makes_its_feishu_schedule_views_unreadable(any_hub):
    hub = any_hub
    h = hub.hub
    _carol, _dave, viewers = await _setup(h)
    admin = await h.auth.authenticate(hub.admin_token)
    await h.identity.set_execution_access(admin, "carol", revoked=True)
    for key in ("carol_a", "carol_b"):
        v = viewers[key]
        assert await _bot_view(h, v) == set() == await _rest_view(h, v.caller())
        for name in ("frozen_a", "frozen_b"):
            assert not await _readable(h.schedules.card(v.caller(), f"sch_{name}"))
            assert not await _readable(h.schedules.pause(v.caller(), f"sch_{name}"))   # no action either
    assert await _bot_view(h, viewers["dave_a"]) == {"daves"}   # only that principal's
    assert await _rest_view(h, _carol) == {"frozen_a", "frozen_b", "unbound", "old_binding"}  # operator view unchanged
    await h.identity.set_execution_access(admin, "carol", revoked=False)
    assert await _bot_view(h, viewers["carol_a"]) == {"frozen_a"}


async def test_execution_access_is_changed_by_an_admin_only_over_rest_and_the_cli(hub):
    from tests.integration.test_cli_rest import amux
    h = hub.hub
    _carol, _dave, viewers = await _setup(h)
    carol_token = await h.auth.create_token("carol")
    code, _out, err = await amux("identity", "execution", "carol", "--revoke",
                                 env={"AMUX_HUB_URL": hub.url, "AMUX_TOKEN": carol_token})
    assert code == 3 and "admin token" in err, err
    assert await _bot_view(h, viewers["carol_a"]) == {"frozen_a"}
    env = {"AMUX_HUB_URL": hub.url, "AMUX_TOKEN": hub.admin_token}
    code, out, err = await amux("identity", "execution", "carol", "--revoke", env=env)
    assert code == 0 and "carol: execution access revoked" in out, err
    assert await _bot_view(h, viewers["carol_a"]) == set()
    code, out, err = await amux("identity", "execution", "nobody", "--restore", env=env)
    assert code == 3 and "does not exist" in err, err
    code, out, err = await amux("identity", "execution", "carol", "--restore", env=env)
    assert code == 0 and "restored" in out, err
    assert await _bot_view(h, viewers["carol_a"]) == {"frozen_a"}


async def test_a_schedule_frozen_to_another_application_is_not_shown_in_this_one(hub):
    hub = hub.hub
    _carol, _dave, viewers = await _setup(hub)
    assert "frozen_b" not in await _bot_view(hub, viewers["carol_a"])
    assert "frozen_a" not in await _rest_view(hub, viewers["carol_b"].caller())


async def test_an_unlinked_viewer_binding_sees_nothing_now(hub):
    hub = hub.hub
    _carol, _dave, viewers = await _setup(hub)
    async with hub.db.write() as conn:
        await conn.execute(identity_bindings.update().where(identity_bindings.c.id == viewers["carol_a"].binding_id)
                           .values(status="revoked"))
    assert await _bot_view(hub, viewers["carol_a"]) == set() == await _rest_view(hub, viewers["carol_a"].caller())


async def test_operator_and_cli_access_is_unchanged_by_the_feishu_rules(hub):
    h = hub.hub
    carol, dave, _viewers = await _setup(h)
    assert await _rest_view(h, carol) == {"frozen_a", "frozen_b", "unbound", "old_binding"}   # the creator's token
    admin = await h.auth.authenticate(hub.admin_token)
    assert {s["name"] for s in await h.schedules.list(admin, all_principals=True)} >= {"daves", "unbound"}
