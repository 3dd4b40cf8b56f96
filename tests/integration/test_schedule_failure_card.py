"""A schedule whose Task did not succeed: its Results card, opened from the cards over signed Feishu callbacks,
names the outcome (the catalog's word, in each language) and the hub's error (its own words, escaped)."""
from __future__ import annotations

import pytest
import sqlalchemy as sa

from bot.cards.actions import CardAction
from hub.domain.tasks import Status
from hub.services.tasks.service import finish_task
from hub.store.tables import firings, schedules
from tests.fakes.feishu import card_buttons, card_text
from tests.integration.test_feishu_bot import Bot, bot  # noqa: F401 — the fixture

ERROR = "engine exited with status 2: *boom* <at id=all></at>"


def press_value(card: dict, label: str) -> dict:
    """Return the callback value of the card's one button labelled `label` (English)."""
    found = [b["behaviors"][0]["value"] for b in card_buttons(card) if b["text"]["content"] == label]
    assert len(found) == 1, f"no single {label!r} button in {card_text(card)}"
    return found[0]


async def fire_once(b: Bot, sid: str) -> str:
    """Fire the schedule now; return the Task its firing admitted."""
    async with b.hub.db.write() as conn:
        await conn.execute(schedules.update().where(schedules.c.id == sid).values(next_fire_at=b.clock.now()))
    assert await b.hub.schedule_firing.fire_due() == 1
    async with b.hub.db.read() as conn:
        task_id = (await conn.execute(sa.select(firings.c.task_id).where(firings.c.schedule_id == sid))).scalar()
    assert task_id
    return task_id


async def open_results(b: Bot, open_id: str) -> dict:
    """From `/amux`, press Personal schedules → Open → Results, each from the card the last press answered."""
    card = await b.overview_card(open_id)
    for label in ("Personal schedules", "Open", "Results"):
        status, res = await b.press(open_id, press_value(card, label))
        assert status == 200, res
        card = res["card"]["data"]
    return card


@pytest.mark.parametrize(("outcome", "en", "zh"), [
    ("failed", "failed", "失败"), ("timed_out", "timed out", "超时"), ("cancelled", "cancelled", "已取消")])
async def test_an_unsuccessful_runs_results_card_names_its_outcome_and_the_hubs_error(bot: Bot, outcome: str,
                                                                                      en: str, zh: str):
    await bot.overview_card("ou_alice")
    alice = await bot.principal("ou_alice")
    sid = await bot.schedule(alice, "nightly report")
    task_id = await fire_once(bot, sid)
    if outcome == "cancelled":       # the hub's own cancel and its own words
        await bot.hub.tasks.cancel(alice, task_id)
        error = "cancelled before it started"
    else:                            # what a runner's terminal report records
        async with bot.hub.db.write() as conn:
            assert await finish_task(conn, task_id, Status(outcome), bot.clock.now(), error=ERROR)
        error = ERROR
    await bot.hub.schedule_firing.reconcile()

    card = await open_results(bot, "ou_alice")
    english, chinese = card_text(card, "en_us"), card_text(card, "zh_cn")
    assert f"**Outcome**: {en}" in english and f"**结果**：{zh}" in chinese
    if outcome == "cancelled":
        assert f"**Error**: {error}" in english and f"**错误**：{error}" in chinese
    else:                            # user text: no mention, no formatting sneaks in
        shown = r"engine exited with status 2: \*boom\* \<at id=all\>\</at\>"
        assert f"**Error**: {shown}" in english and f"**错误**：{shown}" in chinese
        assert "<at" not in english.replace(r"\<at", "")


async def test_a_successful_runs_results_card_shows_no_failure(bot: Bot):
    await bot.overview_card("ou_alice")
    alice = await bot.principal("ou_alice")
    sid = await bot.schedule(alice, "nightly report")
    task_id = await fire_once(bot, sid)
    async with bot.hub.db.write() as conn:
        await finish_task(conn, task_id, Status.SUCCEEDED, bot.clock.now(), result_text="all green")
    await bot.hub.schedule_firing.reconcile()
    card = await open_results(bot, "ou_alice")
    assert "Outcome" not in card_text(card) and "Error" not in card_text(card)
    assert any(e.get("content") == "all green" for e in card["body"]["elements"])
    assert CardAction.unpack(press_value(card, "Schedule")).schedule_id == sid
