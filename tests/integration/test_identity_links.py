"""Identities link (DESIGN §7): `amux identity link` → `/amux link CODE` in Feishu → that identity acts as the
existing principal; schedules made over MCP/CLI freeze the creator's single binding; with none and one Feishu
application, its administrator is told with the principal's name; `amux schedule get` says why not otherwise.

Over real HTTP: the real `amux` console script, signed and encrypted Feishu events, replies through lark-oapi
to the fake Feishu server.
"""
from __future__ import annotations

import asyncio
import json
import os
import sqlite3
import sys
from pathlib import Path

import sqlalchemy as sa

from hub.config import FeishuAppSettings
from hub.services.auth.identity import code_hash, normalize
from hub.store.tables import identity_bindings, identity_link_codes, schedules
from tests.fakes.feishu import card_text
from tests.integration.test_alerts_feishu import ADMIN as ALERT_ADMIN, fake, make_env  # noqa: F401 — fixture
from tests.integration.test_feishu_bot import ADMIN, Bot, bot  # noqa: F401 — fixture
from tests.helpers import eventually

AMUX = str(Path(sys.executable).parent / "amux")
CLEAN = ("AMUX_HOME", "AMUX_HUB_URL", "AMUX_TOKEN", "AMUX_SESSION_ID")


async def amux(bot: Bot, token: str, *args: str) -> tuple[int, dict | str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    proc = await asyncio.create_subprocess_exec(AMUX, *args, "--hub", bot.url, "--token", token, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    text = out.decode()
    try:
        return proc.returncode, json.loads(text), err.decode()
    except ValueError:
        return proc.returncode, text, err.decode()


async def send_link(bot: Bot, open_id: str, text: str) -> dict:
    """Send `text` as a chat message and return the bot's reply card."""
    before = len(bot.fake.sent)
    status, _, mid = await bot.message(open_id, text)
    assert status == 200
    await eventually(lambda: _true(len(bot.fake.sent) > before))
    reply = bot.fake.sent[-1]
    assert reply.reply_to == mid
    return json.loads(reply.content) if isinstance(reply.content, str) else reply.content


async def _true(v):
    return v


async def bindings(bot: Bot, open_id: str) -> list:
    async with bot.hub.db.read() as conn:
        return (await conn.execute(sa.select(identity_bindings).where(identity_bindings.c.open_id == open_id))).all()


async def test_identity_link_binds_the_feishu_identity_to_the_existing_principal(bot: Bot):
    token = await bot.hub.auth.create_token("carol")
    carol = await bot.hub.auth.authenticate(token)
    code, res, err = await amux(bot, token, "identity", "link", "--json")
    assert code == 0, err
    assert res["principal"] == "carol" and res["valid_s"] == 600 and normalize(res["code"])
    card = await send_link(bot, "ou_carol", f"/amux link {res['code']}")
    assert "now acts as **carol**" in card_text(card) and "已关联" in card_text(card, "zh_cn")
    rows = await bindings(bot, "ou_carol")
    assert [(r.principal_id, r.status, r.union_id) for r in rows] == [(carol.principal_id, "active", "on_carol")]
    # The linked identity now sees carol's own view: the overview greets the existing principal.
    overview = await bot.overview_card("ou_carol")
    assert "carol" in card_text(overview)
    code, listing, err = await amux(bot, token, "identity", "list", "--json")
    assert code == 0 and [b["open_id"] for b in listing["identities"]] == ["ou_carol"]


async def test_link_code_is_stored_hashed(bot: Bot):
    token = await bot.hub.auth.create_token("carol")
    _, res, _ = await amux(bot, token, "identity", "link", "--json")
    async with bot.hub.db.read() as conn:
        row = (await conn.execute(sa.select(identity_link_codes))).one()
    assert row.code_hash == code_hash(normalize(res["code"])) and normalize(res["code"]) not in json.dumps(
        {k: str(v) for k, v in row._mapping.items()})


async def test_link_code_expires_after_10_minutes_and_nothing_changes(bot: Bot):
    token = await bot.hub.auth.create_token("carol")
    _, res, _ = await amux(bot, token, "identity", "link", "--json")
    bot.clock.advance(601)
    card = await send_link(bot, "ou_carol", f"/amux link {res['code']}")
    assert "expired" in card_text(card) and "amux identity link" in card_text(card)
    assert await bindings(bot, "ou_carol") == []


async def test_link_code_works_once(bot: Bot):
    token = await bot.hub.auth.create_token("carol")
    _, res, _ = await amux(bot, token, "identity", "link", "--json")
    await send_link(bot, "ou_carol", f"/amux link {res['code']}")
    card = await send_link(bot, "ou_dave", f"/amux link {res['code'].lower()}")
    assert "already used" in card_text(card) and "amux identity link" in card_text(card)
    assert await bindings(bot, "ou_dave") == []


async def test_link_without_a_code_or_with_junk_answers_how_to_get_one(bot: Bot):
    for text, words in (("/amux link", "No link code"), ("/amux link hello", "not a link code"),
                        ("/amux link ABCD-EFGH-JKLM", "not known")):
        card = await send_link(bot, "ou_erin", text)
        assert words in card_text(card) and "amux identity link" in card_text(card), card_text(card)
        assert card_text(card, "zh_cn") != card_text(card)
    assert await bindings(bot, "ou_erin") == []


async def test_link_code_for_a_principal_that_was_deleted_answers_the_fix(bot: Bot):
    token = await bot.hub.auth.create_token("gone")
    gone = await bot.hub.auth.authenticate(token)
    _, res, _ = await amux(bot, token, "identity", "link", "--json")
    # No command deletes a principal; remove the row behind the hub's back (sqlite3 without foreign keys).
    with sqlite3.connect(sa.engine.make_url(bot.hub.db.url).database) as raw:
        raw.execute("DELETE FROM principals WHERE id = ?", (gone.principal_id,))
    card = await send_link(bot, "ou_frank", f"/amux link {res['code']}")
    assert "no longer exists" in card_text(card) and "amux identity link" in card_text(card)
    assert await bindings(bot, "ou_frank") == []


async def test_linking_moves_an_identity_that_first_contact_bound_to_a_new_principal(bot: Bot):
    await bot.overview_card("ou_grace")               # first contact: a principal of its own
    first = (await bindings(bot, "ou_grace"))[0]
    token = await bot.hub.auth.create_token("grace")
    grace = await bot.hub.auth.authenticate(token)
    _, res, _ = await amux(bot, token, "identity", "link", "--json")
    await send_link(bot, "ou_grace", f"/amux link {res['code']}")
    rows = await bindings(bot, "ou_grace")
    assert [(r.id, r.principal_id, r.status) for r in rows] == [(first.id, grace.principal_id, "active")]


async def test_identity_list_all_is_for_admins_and_unlink_revokes_then_the_identity_may_link_again(bot: Bot):
    token = await bot.hub.auth.create_token("carol")
    _, res, _ = await amux(bot, token, "identity", "link", "--json")
    await send_link(bot, "ou_carol", f"/amux link {res['code']}")
    await bot.overview_card("ou_other")
    code, _, err = await amux(bot, token, "identity", "list", "--all")
    assert code == 3 and "admin token" in err
    admin = await bot.hub.auth.create_token("ops", admin=True)
    _, everyone, _ = await amux(bot, admin, "identity", "list", "--all", "--json")
    assert {b["open_id"] for b in everyone["identities"]} == {"ou_carol", "ou_other"}
    bid = (await bindings(bot, "ou_carol"))[0].id
    other = (await bindings(bot, "ou_other"))[0].id
    code, _, err = await amux(bot, token, "identity", "unlink", other)
    assert code == 3 and "not yours" in err
    code, out, err = await amux(bot, token, "identity", "unlink", bid)
    assert code == 0 and "revoked" in out
    assert (await bindings(bot, "ou_carol"))[0].status == "revoked"
    _, res, _ = await amux(bot, token, "identity", "link", "--json")
    card = await send_link(bot, "ou_carol", f"/amux link {res['code']}")
    assert "carol" in card_text(card) and (await bindings(bot, "ou_carol"))[0].status == "active"


async def test_schedule_created_over_the_cli_freezes_the_creators_single_active_binding(bot: Bot):
    token = await bot.hub.auth.create_token("carol")
    _, res, _ = await amux(bot, token, "identity", "link", "--json")
    await send_link(bot, "ou_carol", f"/amux link {res['code']}")
    bid = (await bindings(bot, "ou_carol"))[0].id
    code, s, err = await amux(bot, token, "schedule", "create", "--type", "subtask", "--rule", "every 1h",
                              "--prompt", "say hi", "--json")
    assert code == 0, err
    async with bot.hub.db.read() as conn:
        row = (await conn.execute(sa.select(schedules).where(schedules.c.id == s["schedule_id"]))).one()
    assert (row.creator_binding_id, row.app_id) == (bid, bot.app_id)
    assert row.provenance["attribution"]["basis"] == "single_active_binding"
    code, out, _ = await amux(bot, token, "schedule", "get", s["schedule_id"])
    assert f"notices go to the administrator of {bot.app_id}" in out


async def test_schedule_get_says_why_a_schedule_will_not_notify(bot: Bot):
    bot.hub.settings.feishu.apps.append(FeishuAppSettings(app_id="cli_second", app_secret="s", admin_open_id="ou_x"))
    await bot.hub.alerts.sync_apps()
    token = await bot.hub.auth.create_token("nobody")
    code, s, err = await amux(bot, token, "schedule", "create", "--type", "subtask", "--rule", "every 1h",
                              "--prompt", "say hi", "--json")
    assert code == 0, err
    assert s["notifications"]["notifies"] is False
    code, out, _ = await amux(bot, token, "schedule", "get", s["schedule_id"])
    assert "will not notify" in out and "amux identity link" in out


async def test_schedule_with_no_binding_and_one_feishu_app_notifies_its_admin_with_the_principals_name(
        db_url, tmp_path, clock, fake):
    env = await make_env(db_url, tmp_path, clock, fake)
    await env.setup(name="solo job")
    async with env.hub.db.write() as conn:      # alice never linked a Feishu identity: no binding at creation
        await conn.execute(identity_bindings.delete())
        await conn.execute(schedules.update().values(creator_binding_id=None, app_id=None,
                                                     provenance={"source": "cli"}))
    view = await env.hub.schedules.get(env.alice, env.sid)
    assert view["notifications"]["basis"] == "sole_app"
    await env.fire("failed")
    await env.round(61)
    assert len(fake.sent) == 1 and fake.sent[0].receive_id == ALERT_ADMIN
    assert "alice" in card_text(fake.sent[0].content) and "solo job" in card_text(fake.sent[0].content)
    await env.hub.db.close()
