"""One authorization policy (hub/services/schedule_access.py): the bot's personal views and card actions, the
REST/MCP schedule reads and recovery's personal view make the same decision, table-driven over one set of schedules.
"""
from __future__ import annotations

from bot.handlers.schedules import PAGE
from bot.identity import Viewer
from hub.ids import new_id
from hub.services.auth import Caller
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


async def _recovery_view(hub, v: Viewer) -> set[str]:
    return {s["name"] for s in await hub.recovery.personal(v.app_id, v.open_id)}


EXPECTED = {
    "carol_a": {"frozen_a", "unbound"},     # not B's, not one whose creator binding was unlinked, never dave's
    "carol_b": {"frozen_b", "unbound"},
    "dave_a": {"daves"},
}


async def test_personal_views_card_actions_rest_reads_and_recovery_make_the_same_decision(hub):
    hub = hub.hub
    _carol, _dave, viewers = await _setup(hub)
    for key, v in viewers.items():
        bot, rest, recovery = await _bot_view(hub, v), await _rest_view(hub, v.caller()), await _recovery_view(hub, v)
        assert bot == rest == recovery == EXPECTED[key], key
        for name in {"frozen_a", "frozen_b", "unbound", "old_binding", "daves"}:   # single reads agree with lists
            readable = await _readable(hub.schedules.get(v.caller(), f"sch_{name}"))
            assert readable == (name in EXPECTED[key]), (key, name)
            card = await _readable(hub.schedules.card(v.caller(), f"sch_{name}"))   # the bot's detail and controls
            assert card == (name in EXPECTED[key]), (key, name)


async def test_schedule_with_no_creator_binding_is_visible_only_to_its_creators_own_linked_identities(hub):
    hub = hub.hub
    _carol, _dave, viewers = await _setup(hub)
    assert "unbound" in await _bot_view(hub, viewers["carol_a"])
    assert "unbound" in await _bot_view(hub, viewers["carol_b"])
    assert "unbound" not in await _bot_view(hub, viewers["dave_a"])


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
