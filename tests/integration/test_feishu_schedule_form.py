"""The schedule form (issue 32) end to end: the form's own JSON, and submissions built the way Feishu sends them
(`form_value` in a signed, encrypted `card.action.trigger`) through the real hub, with the real lark-oapi replies to
the fake Feishu server. Journeys: create → list → fires → history; edit the time → the next run moves; run now → one
extra firing with its Task; refusals name the field and store nothing; another user's schedule id; a double submit."""
from __future__ import annotations

import uuid

import sqlalchemy as sa

from bot.cards.actions import CardAction
from bot.cards.base import size_bytes
from hub.store.tables import firings, identity_bindings, schedules, task_runs
from tests.integration.test_feishu_bot import ADMIN, Bot, bot  # noqa: F401 — the fixture

USER = "ou_form_user"


def _find(node, pred):  # noqa: ANN001, ANN202
    if isinstance(node, dict):
        if pred(node):
            yield node
        for v in node.values():
            yield from _find(v, pred)
    elif isinstance(node, list):
        for v in node:
            yield from _find(v, pred)


def form_of(card: dict) -> dict:
    [form] = [e for e in card["body"]["elements"] if e["tag"] == "form"]
    return form


def submit_value(card: dict) -> dict:
    [btn] = [e for e in form_of(card)["elements"] if e["tag"] == "button"]
    assert btn["form_action_type"] == "submit"
    return btn["behaviors"][0]["value"]


async def submit(b: Bot, open_id: str, value: dict, form_value: dict) -> dict:
    """Send a form submission as Feishu does: the submit button's value, every field's value in form_value."""
    event = {"operator": {"tenant_key": "t1", "open_id": open_id, "union_id": f"on_{open_id[3:]}"},
             "token": f"c-{uuid.uuid4().hex}", "host": "im_message",
             "action": {"value": value, "tag": "button", "name": "submit", "form_value": form_value},
             "context": {"open_message_id": "om_form", "open_chat_id": f"oc_{open_id}"}}
    status, body = await b.post(b.envelope("card.action.trigger", event))
    assert status == 200
    return body


NEW = CardAction.of("new")


async def open_form(b: Bot, open_id: str, action: CardAction = NEW) -> dict:
    status, body = await b.press(open_id, action)
    assert status == 200, body
    return body["card"]["data"]


def fields(**kw) -> dict:  # noqa: ANN003
    base = {"name": "nightly", "prompt": "say hello", "when": "0 3 * * *", "timezone": "UTC", "profile": "-",
            "notify": "failures"}
    return {**base, **kw}


async def count(b: Bot, table) -> int:  # noqa: ANN001
    async with b.hub.db.read() as conn:
        return (await conn.execute(sa.select(sa.func.count()).select_from(table))).scalar()


async def test_the_form_json_has_every_field_the_submit_button_and_both_languages(bot: Bot):
    await bot.overview_card(USER)  # first contact: an active binding
    card = await open_form(bot, USER)
    form = form_of(card)
    names = [e.get("name") for e in form["elements"] if e["tag"] in ("input", "select_static")]
    assert names == ["name", "prompt", "when", "timezone", "profile", "notify"]
    tz = next(e for e in form["elements"] if e.get("name") == "timezone")
    assert tz["default_value"] == "Asia/Shanghai"  # the application's timezone
    notify = next(e for e in form["elements"] if e.get("name") == "notify")
    assert [o["value"] for o in notify["options"]] == ["all", "failures", "none"]
    profile = next(e for e in form["elements"] if e.get("name") == "profile")
    offered = [o["value"] for o in profile["options"]]
    assert offered[0] == "-" and "scripted" in offered  # the hub default, then what admission lets this person use
    assert notify["options"][1]["text"]["i18n_content"] == {"en_us": "Failures only", "zh_cn": "仅失败时"}
    when = next(e for e in form["elements"] if e.get("name") == "when")
    assert "@daily" in when["placeholder"]["content"] and "every 30m" in when["placeholder"]["content"]
    value = submit_value(card)
    assert value["op"] == "save" and value["n"]
    assert card["header"]["title"]["i18n_content"] == {"en_us": "New schedule", "zh_cn": "新建定时任务"}
    for node in _find(card, lambda n: n.get("tag") == "plain_text"):
        assert set(node["i18n_content"]) == {"en_us", "zh_cn"}
    assert size_bytes(card) < 30 * 1024


async def test_create_then_list_then_it_fires_then_its_history(bot: Bot):
    await bot.overview_card(USER)
    card = await open_form(bot, USER)
    body = await submit(bot, USER, submit_value(card), fields(when="every 1h", profile="scripted"))
    assert body["toast"]["type"] == "success", body
    detail = body["card"]["data"]
    ops = [b["behaviors"][0]["value"]["op"] for b in _find(detail, lambda n: n.get("tag") == "button")]
    assert "edit" in ops and "run" in ops
    async with bot.hub.db.read() as conn:
        [row] = (await conn.execute(sa.select(schedules))).all()
    viewer = await bot.principal(USER)
    assert row.creator_id == viewer.principal_id and row.creator_binding_id and row.app_id == bot.app_id
    assert row.provenance["source"] == "feishu-card" and row.profile == "scripted"
    assert row.provenance["receipt"]["kind"] == "card_action" and row.provenance["receipt"]["open_id"] == USER
    assert row.provenance["attribution"]["basis"] == "card_action_receipt"
    # at once in the personal list
    _, listing = await bot.press(USER, CardAction.of("schedules"))
    assert "nightly" in str(listing["card"]["data"])
    # it fires (the injected clock) and shows in its history
    bot.clock.advance(3600)
    await bot.hub.schedule_firing.fire_due()
    _, hist = await bot.press(USER, CardAction.of("history", schedule_id=row.id))
    assert await count(bot, firings) == 1 and await count(bot, task_runs) == 1
    text = str(hist["card"]["data"])
    assert "nightly" in text and "No runs yet" not in text


async def test_edit_the_time_moves_the_next_run_and_keeps_the_creator(bot: Bot):
    await bot.overview_card(USER)
    await submit(bot, USER, submit_value(await open_form(bot, USER)), fields(when="0 3 * * *"))
    async with bot.hub.db.read() as conn:
        before = (await conn.execute(sa.select(schedules))).one()
    card = await open_form(bot, USER, CardAction.of("edit", schedule_id=before.id))
    assert card["header"]["title"]["content"] == "Edit schedule"
    filled = {e["name"]: e.get("default_value", e.get("initial_option")) for e in form_of(card)["elements"]
              if e.get("name") in ("name", "prompt", "when", "timezone", "profile", "notify")}
    assert filled == fields(when="0 3 * * *")
    body = await submit(bot, USER, submit_value(card), fields(when="0 4 * * *"))
    assert body["toast"]["type"] == "success", body
    async with bot.hub.db.read() as conn:
        after = (await conn.execute(sa.select(schedules))).one()
    assert after.rule == "0 4 * * *" and after.next_fire_at != before.next_fire_at
    assert after.next_fire_at.hour == 4
    assert (after.creator_id, after.creator_binding_id, after.provenance) == (
        before.creator_id, before.creator_binding_id, before.provenance)
    assert "04:00" in str(body["card"]["data"])  # the recomputed next run is shown


async def test_run_now_is_one_extra_manual_firing_with_its_task(bot: Bot):
    await bot.overview_card(USER)
    await submit(bot, USER, submit_value(await open_form(bot, USER)), fields(when="@daily"))
    async with bot.hub.db.read() as conn:
        s = (await conn.execute(sa.select(schedules))).one()
    status, body = await bot.press(USER, CardAction.of("run", schedule_id=s.id))
    assert status == 200 and body["toast"]["type"] == "success", body
    async with bot.hub.db.read() as conn:
        [f] = (await conn.execute(sa.select(firings))).all()
        after = (await conn.execute(sa.select(schedules))).one()
        task = (await conn.execute(sa.select(task_runs).where(task_runs.c.id == f.task_id))).one()
    assert f.manual and f.admission == "ok" and task.owner_id == s.creator_id
    assert after.next_fire_at == s.next_fire_at


async def test_refusals_name_the_field_in_both_languages_and_store_nothing(bot: Bot):
    bot.hub.schedules.settings.min_interval_s = 60  # the hub's minimum interval, as MCP schedule_create applies it
    await bot.overview_card(USER)
    cases = [(fields(when="*/1 * * * * *"), "When", "时间"), (fields(when="every 1s"), "When", "时间"),
             (fields(prompt=""), "Prompt", "提示词"), (fields(timezone="Mars/Olympus"), "Timezone", "时区"),
             (fields(when="2020-01-01 09:00"), "When", "时间"), (fields(profile="nope"), "Profile", "配置")]
    for form_value, en, zh in cases:
        card = await open_form(bot, USER)
        body = await submit(bot, USER, submit_value(card), form_value)
        assert body["toast"]["type"] == "error", (form_value, body)
        refused = body["card"]["data"]
        note = refused["body"]["elements"][0]["i18n_content"]
        assert f"**{en}**" in note["en_us"] and f"**{zh}**" in note["zh_cn"], (form_value, note)
        assert form_of(refused)  # the form again, filled in with what was sent
        assert await count(bot, schedules) == 0


async def test_another_users_schedule_id_edited_into_the_callback_is_refused(bot: Bot):
    await bot.overview_card(USER)
    await submit(bot, USER, submit_value(await open_form(bot, USER)), fields())
    async with bot.hub.db.read() as conn:
        theirs = (await conn.execute(sa.select(schedules))).one()
    await bot.overview_card("ou_mallory")
    forged = submit_value(await open_form(bot, "ou_mallory"))
    forged["s"] = theirs.id
    body = await submit(bot, "ou_mallory", forged, fields(prompt="steal", when="every 1h"))
    assert body["toast"]["type"] == "error" and "card" not in body
    for op in ("edit", "run"):
        _, body = await bot.press("ou_mallory", CardAction.of(op, schedule_id=theirs.id))
        assert body["toast"]["type"] == "error" and "card" not in body
    async with bot.hub.db.read() as conn:
        still = (await conn.execute(sa.select(schedules))).one()
    assert (still.prompt, still.rule, still.updated_at) == (theirs.prompt, theirs.rule, theirs.updated_at)
    assert await count(bot, firings) == 0


async def test_a_form_submitted_twice_makes_one_schedule(bot: Bot):
    await bot.overview_card(USER)
    value = submit_value(await open_form(bot, USER))
    first = await submit(bot, USER, value, fields())
    second = await submit(bot, USER, value, fields())
    assert first["toast"]["type"] == "success" and second["toast"]["type"] == "info" and "card" not in second
    assert await count(bot, schedules) == 1


async def test_a_form_from_a_retired_card_is_refused(bot: Bot):
    await bot.overview_card(USER)
    value = {**submit_value(await open_form(bot, USER)), "v": 0}
    body = await submit(bot, USER, value, fields())
    assert body["toast"]["type"] == "warning"
    assert await count(bot, schedules) == 0


async def test_a_person_without_an_active_binding_is_told_to_link(bot: Bot):
    await bot.overview_card(USER)
    value = submit_value(await open_form(bot, USER))
    viewer = await bot.principal(USER)
    async with bot.hub.db.read() as conn:
        binding = (await conn.execute(sa.select(identity_bindings.c.id)
                                      .where(identity_bindings.c.open_id == USER))).scalar()
    await bot.hub.identity.unlink(viewer, binding)
    for send in (lambda: bot.press(USER, CardAction.of("new")), None):
        if send is not None:
            _, body = await send()
        else:
            body = await submit(bot, USER, value, fields())
        assert body["toast"]["type"] == "error" and "/amux link" in body["toast"]["content"], body
        assert "/amux link" in body["toast"]["i18n"]["zh_cn"]
    assert await count(bot, schedules) == 0
