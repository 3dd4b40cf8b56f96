"""The Agent Timeline button over the fake Feishu server: a signed card callback built from the button's own value
sends the clicker — the run's owner, privately — a one-time sign-in link that lands on the timeline page; anyone
else gets a refusal and nothing is sent."""
from __future__ import annotations

import json
import re

import httpx2

from bot.cards.schedules import render_results
from bot.cards.timeline import timeline_button
from bot.cards.views import Outcome, ResultsView
from bot.i18n import catalogs
from hub.services.tasks.service import SubmitRequest
from tests.fakes.feishu import card_buttons, card_text
from tests.helpers import eventually
from tests.integration.test_feishu_bot import Bot, bot  # noqa: F401 — the bot fixture, reused

LINK = re.compile(r"\((http://[^)]+/oauth/login\?code=[^)&]+&next=[^)]+)\)")


async def alices_task(b: Bot) -> str:
    await b.overview_card("ou_alice")  # first contact binds the identity
    alice = await b.principal("ou_alice")
    return (await b.hub.tasks.submit(alice, SubmitRequest(prompt="say hi", profile="scripted")))["task_id"]


async def test_the_timeline_button_sends_its_owner_a_private_link_that_lands_on_the_timeline_page(bot: Bot):
    bot.hub.runner_dispatch.hub_url = bot.url
    task_id = await alices_task(bot)
    value = timeline_button(catalogs(), "task", task_id)["behaviors"][0]["value"]
    before = len(bot.fake.sent)
    status, answer = await bot.press("ou_alice", value)
    assert status == 200 and answer["toast"]["type"] == "success", answer

    async def private() -> object:
        return next((m for m in bot.fake.sent[before:] if m.receive_id == "ou_alice" and m.reply_to is None), None)
    sent = await eventually(private)
    content = sent.content if isinstance(sent.content, dict) else json.loads(sent.content)
    link = LINK.search(card_text(content, "en_us")).group(1)
    assert "amux." not in link  # a one-time code, never a token
    code, nxt = link.split("code=", 1)[1].split("&next=")
    assert nxt == f"/timeline/tasks/{task_id}"
    async with httpx2.AsyncClient(timeout=10, follow_redirects=False) as browser:
        assert (await browser.get(link)).status_code == 200  # a preview does not spend it
        login = await browser.post(f"{bot.url}/oauth/login", data={"code": code, "next": nxt})
        assert login.status_code == 303 and login.headers["location"] == nxt
        page = await browser.get(f"{bot.url}{nxt}")
        assert page.status_code == 200 and task_id in page.text


async def test_another_users_click_on_the_timeline_button_is_refused_and_sends_nothing(bot: Bot):
    task_id = await alices_task(bot)
    await bot.overview_card("ou_bob")
    value = timeline_button(catalogs(), "task", task_id)["behaviors"][0]["value"]
    before = len(bot.fake.sent)
    status, answer = await bot.press("ou_bob", value)
    assert status == 200 and answer["toast"]["type"] == "error"
    assert "not yours" in answer["toast"]["content"]
    assert not [m for m in bot.fake.sent[before:] if m.reply_to is None]


def test_the_personal_schedule_result_card_links_the_firings_timeline():
    view = ResultsView(schedule_id="sch_1", name="nightly", page=0, pages=1, part=0, parts=1, text="ok",
                       firing=Outcome("nightly", "2026-12-01T08:00:00+00:00", "succeeded", "fir_1"), task_id="tr_abc")
    values = [b["behaviors"][0]["value"] for b in card_buttons(render_results(view, catalogs()))]
    assert {"p": "amux", "v": 1, "op": "timeline", "r": "tr_abc"} in values
