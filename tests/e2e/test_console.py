"""The bot console in headless Chromium: `/amux`, click through personal schedules and back, as a user and the admin."""
from __future__ import annotations

import contextlib
import datetime as dt
import shutil
from pathlib import Path
from typing import AsyncIterator
from zoneinfo import ZoneInfo

import pytest
import sqlalchemy as sa
from aiohttp import web
from playwright.async_api import Browser, Page, async_playwright

from hub.app import Hub
from hub.clock import ManualClock
from hub.config import FeishuAppSettings
from hub.ids import new_id
from hub.services.auth.service import Caller
from hub.services.schedules.service import ScheduleSpec
from hub.store.db import Database
from bot.cards.base import card, markdown, same
from hub.store.tables import identity_bindings, outbox, runtimes, schedules
from tests.helpers import hub_settings

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]

pytestmark = pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="install it: apt-get install -y chromium")


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """Launch headless Chromium (inside the test's own task)."""
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield browser
        finally:
            await browser.close()


@contextlib.asynccontextmanager
async def serve(sqlite_url: str, tmp_path: Path, clock: ManualClock, apps: list[FeishuAppSettings]):
    """Run a hub with `apps` on a real port; yield (hub, url, admin token, user token)."""
    settings = hub_settings(sqlite_url, tmp_path)
    settings.feishu.apps = apps
    hub = Hub(settings, Database(sqlite_url), clock)
    admin = await hub.auth.create_token("admin", admin=True)
    user = await hub.auth.create_token("someone")
    ops = await hub.auth.authenticate(admin)
    async with hub.db.write() as conn:
        now = clock.now()
        await conn.execute(runtimes.insert().values(
            id=new_id("rt"), name="r1", principal_id=ops.principal_id, shared=True,
            capabilities={"engines": ["scripted"]}, slots=4, status="online", registered_at=now, last_seen_at=now))
    runner = web.AppRunner(hub.web_app(background=False), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]
    try:
        yield hub, f"http://127.0.0.1:{port}", admin, user
    finally:
        await runner.cleanup()
        await hub.db.close()


@pytest.fixture
async def console(sqlite_url: str, tmp_path: Path, clock: ManualClock):
    app = FeishuAppSettings(app_id="cli_demo", app_secret="s", verification_token="vt", admin_open_id="ou_boss",
                            base_url="http://127.0.0.1:9")
    async with serve(sqlite_url, tmp_path, clock, [app]) as handle:
        yield handle


@pytest.fixture
async def local_console(sqlite_url: str, tmp_path: Path, clock: ManualClock):
    """A hub with no Feishu application: the console offers its own, cli_console (administrator ou_admin)."""
    async with serve(sqlite_url, tmp_path, clock, []) as handle:
        yield handle


async def connect(page: Page, url: str, token: str, open_id: str) -> None:
    await page.goto(f"{url}/console")
    await page.fill("#token", token)
    await page.evaluate("document.getElementById('toast').textContent = ''")
    await page.click("#connect")
    await page.locator("#toast:not(:empty)").wait_for()
    await page.fill("#user", open_id)


async def send(page: Page, text: str) -> None:
    n = await page.locator(".card, .text").count()
    await page.fill("#text", text)
    await page.click("#sendbtn")
    await page.locator(".card, .text").nth(n).wait_for()


async def test_console_runs_the_bot_through_the_same_handlers(console):
    hub, url, admin, user = console
    async with chromium() as browser:
        page = await browser.new_page()
        await connect(page, url, user, "ou_alice")                 # a non-admin token cannot drive the console
        assert await page.locator("#app option").count() == 0
        assert "administrator token" in await page.inner_text("#toast")

        await connect(page, url, admin, "ou_alice")
        await send(page, "/amux")
        card = page.locator(".card").last
        assert "Your schedules: 0" in await card.inner_text()
        assert await card.locator("button").all_inner_texts() == ["Personal schedules", "New schedule"]

        # the first contact bound ou_alice: give her schedules, then click through
        async with hub.db.read() as conn:
            import sqlalchemy as sa
            pid = (await conn.execute(sa.select(identity_bindings.c.principal_id).where(
                identity_bindings.c.open_id == "ou_alice"))).scalar()
        alice = Caller(pid, "feishu:cli_demo:ou_alice", "t", "feishu", False)
        for i in range(6):
            await hub.schedules.create(alice, ScheduleSpec(prompt="say hi", rule="every 1h", name=f"job <b>{i}</b>"))
        await card.locator("button", has_text="Personal schedules").click()
        await card.locator("header", has_text="Personal schedules").wait_for()
        assert await card.locator("button", has_text="Open").count() == 5
        # text, never HTML
        assert "job <b>0</b>" in await card.inner_text() and await card.locator(".md b b").count() == 0
        await card.locator("button", has_text="Next").click()
        await card.get_by_text("Page 2 of 2").wait_for()
        await card.locator("button", has_text="Open").first.click()
        await card.locator("header", has_text="Schedule").wait_for()
        await card.locator("button", has_text="Pause").click()
        await card.locator("button", has_text="Resume").wait_for()
        assert "Schedule paused" in await page.inner_text("#toast")
        await card.locator("button", has_text="Back to overview").click()
        await card.get_by_text("paused: 1").wait_for()
        await page.select_option("#lang", "zh_cn")
        assert "你的定时任务：6" in await card.inner_text()

        await page.fill("#user", "ou_boss")                            # the administrator sees the alert center
        await page.select_option("#lang", "en_us")
        await send(page, "/amux")
        boss = page.locator(".card").last
        assert await boss.locator("button").all_inner_texts() == ["Personal schedules", "Alert center", "New schedule"]
        await boss.locator("button", has_text="Alert center").click()
        await boss.locator("header", has_text="Alert center").wait_for()
        assert "No active incidents." in await boss.inner_text()


async def test_the_console_creates_and_edits_a_schedule_with_the_form_in_both_languages(console):
    hub, url, admin, _user = console
    async with chromium() as browser:
        page = await browser.new_page()
        await connect(page, url, admin, "ou_carol")
        await send(page, "/amux")
        card = page.locator(".card").last
        await card.locator("button", has_text="New schedule").click()
        await card.locator("header", has_text="New schedule").wait_for()
        await page.select_option("#lang", "zh_cn")                   # labels, placeholders and options: the catalog
        assert "提示词" in await card.inner_text() and "仅失败时" in await card.inner_text()
        assert await card.locator("input[name=when]").get_attribute("placeholder") == \
            "例如 0 3 * * * · @daily · every 30m · 2026-12-31 09:00"
        await page.select_option("#lang", "en_us")
        await card.locator("input[name=name]").fill("console job")
        await card.locator("textarea[name=prompt]").fill("say hi")
        await card.locator("input[name=when]").fill("every 1s")     # refused: below a minute is not a rule here
        hub.schedules.settings.min_interval_s = 60
        await card.locator("button", has_text="Create schedule").click()
        await card.get_by_text("Not saved.").wait_for()
        assert "When" in await card.inner_text()
        async with hub.db.read() as conn:
            assert (await conn.execute(sa.select(sa.func.count()).select_from(schedules))).scalar() == 0
        assert await card.locator("input[name=name]").input_value() == "console job"  # filled in with what was sent
        await card.locator("input[name=when]").fill("0 3 * * *")
        await card.locator("button", has_text="Create schedule").click()
        await card.locator("button", has_text="Edit").wait_for()
        assert "Schedule saved" in await page.inner_text("#toast")
        await card.locator("button", has_text="Edit").click()
        await card.locator("header", has_text="Edit schedule").wait_for()
        assert await card.locator("input[name=when]").input_value() == "0 3 * * *"
        await card.locator("input[name=when]").fill("30 4 * * *")
        await card.locator("button", has_text="Save").click()
        await card.get_by_text("30 4 * * *").wait_for()
        async with hub.db.read() as conn:
            row = (await conn.execute(sa.select(schedules))).one()
        assert (row.rule, row.timezone) == ("30 4 * * *", "Asia/Shanghai")  # the application's timezone
        shown = row.next_fire_at.replace(tzinfo=dt.timezone.utc).astimezone(ZoneInfo(row.timezone))
        assert shown.strftime("%H:%M") in await card.inner_text()  # the recomputed next run, in its own zone


async def principal_of(hub: Hub, open_id: str, app_id: str = "cli_demo") -> Caller:
    async with hub.db.read() as conn:
        pid = (await conn.execute(sa.select(identity_bindings.c.principal_id).where(
            identity_bindings.c.open_id == open_id))).scalar()
    return Caller(pid, f"feishu:{app_id}:{open_id}", "t", "feishu", False)


async def test_the_console_renders_card_markdown_code_links_and_lists_and_user_text_stays_text(console):
    hub, url, admin, _user = console
    async with chromium() as browser:
        page = await browser.new_page()
        await connect(page, url, admin, "ou_alice")
        await send(page, "/amux")
        alice = await principal_of(hub, "ou_alice")
        evil = "<script>window.pwned=1</script> **not bold** [x](javascript:alert(1)) `nope`"
        s = await hub.schedules.create(alice, ScheduleSpec(prompt="say hi", rule="every 1h", name=evil))
        async with hub.db.write() as conn:      # one firing, so the overview lists its latest outcome
            await conn.execute(schedules.update().where(schedules.c.id == s["schedule_id"])
                               .values(next_fire_at=hub.clock.now()))
        assert await hub.schedule_firing.fire_due() == 1

        await send(page, "/amux")                                   # a list: the latest outcomes
        overview = page.locator(".card").last
        item = overview.locator(".md ul li").first
        assert evil in await item.inner_text()                      # the bot's escaped user text, shown as typed
        await overview.locator("button", has_text="Personal schedules").click()
        await overview.locator("header", has_text="Personal schedules").wait_for()
        assert await overview.locator(".md code").all_inner_texts() == ["every 1h"]   # `code`
        assert evil in await overview.inner_text()
        # nothing of the user's text became markup: no script ran, no bold, link or code was made of it
        assert await page.evaluate("window.pwned") is None
        assert await overview.locator(".md script, .md a, .md strong strong").count() == 0
        assert await overview.locator(".md strong").all_inner_texts() == [evil]   # the name is bold, as typed

        await send(page, "/amux login")                             # [a link](url)
        link = page.locator(".card").last.locator(".md a")
        assert await link.inner_text() == "open the link"
        href = await link.get_attribute("href")
        assert href.startswith("http") and "/oauth/login?code=" in href
        assert await link.get_attribute("rel") == "noopener noreferrer"

        # the rest of what Feishu renders, in a card of the bot's own building blocks
        md = ("**bold** and *italic* and ~~gone~~ and `a < b`\n```\nfor i in x:\n    print(\"<b>\")\n```\n"
              "1. first\n2. second\n- [ok](https://applink.feishu.cn/client/chat/open) "
              "[bad](javascript:alert(1)) [ftp](ftp://example.com/x)\n\\<script\\>x\\</script\\> \\*plain\\*\n"
              "acked by <at id=ou_admin></at> and \\<at id=ou_fake\\>\\</at\\>")
        doc = card(same("Demo"), [markdown(same(md))])
        await page.evaluate("(c) => cardBox(c, 'om_demo')", doc)
        demo = page.locator(".card").last
        assert await demo.locator(".md strong").inner_text() == "bold"
        assert await demo.locator(".md em").inner_text() == "italic"
        assert await demo.locator(".md del").inner_text() == "gone"
        assert await demo.locator(".md p code").inner_text() == "a < b"
        assert await demo.locator(".md pre code").inner_text() == 'for i in x:\n    print("<b>")'
        assert await demo.locator(".md ol li").all_inner_texts() == ["first", "second"]
        links = demo.locator(".md ul li a")
        assert await links.count() == 1 and await links.get_attribute("href") == \
            "https://applink.feishu.cn/client/chat/open"
        text = await demo.locator(".md").inner_text()
        assert "[bad](javascript:alert(1))" in text and "[ftp](ftp://example.com/x)" in text
        assert "<script>x</script> *plain*" in text and await demo.locator(".md em").count() == 1
        assert await demo.locator(".md span.at").all_inner_texts() == ["@ou_admin"]  # a mention; escaped stays text
        assert "<at id=ou_fake></at>" in text
        assert await page.evaluate("window.pwned") is None


async def test_recheck_in_the_console_answers_for_the_consoles_own_application(local_console):
    hub, url, admin, _user = local_console
    async with chromium() as browser:
        page = await browser.new_page()
        await connect(page, url, admin, "ou_admin")
        assert await page.locator("#app option").all_inner_texts() == ["cli_console (admin ou_admin)"]
        await send(page, "/amux")
        center = page.locator(".card").last
        await center.locator("button", has_text="Alert center").click()
        await center.locator("header", has_text="Alert center").wait_for()
        assert "Delivery: ok" in await center.inner_text()
        await page.evaluate("document.getElementById('toast').textContent = ''")
        await center.locator("button", has_text="Recheck delivery").click()
        await page.locator("#toast:not(:empty)").wait_for()
        assert (await page.inner_text("#toast")).startswith("Delivery rechecked: ok;")
        assert "Delivery: ok" in await center.inner_text()
    answer = await hub.alerts.recheck("cli_console")               # the same real answer the button got
    assert answer["delivery_state"] == "ok" and answer["diagnostic"] is None


async def test_the_console_shows_a_chat_turns_progress_card_and_its_stop_until_it_is_stopped(local_console):
    hub, url, admin, _user = local_console
    async with chromium() as browser:
        page = await browser.new_page()
        await connect(page, url, admin, "ou_console_user")
        await page.select_option("#app", "cli_console")
        await send(page, "tool Read 'the notes'\nsleep 30\nsay late")  # the progress card, read from the outbox
        card = page.locator(".card").last
        await card.locator("header", has_text="The agent is on it").wait_for()
        assert "Waiting to start" in await card.inner_text()
        await card.locator("button", has_text="Stop").click()
        await page.locator("#toast", has_text="Stopping").wait_for()
        await hub.chats.step()  # this hub runs no loops: drive its chat Turns once
        await card.locator("header", has_text="Stopped").wait_for(timeout=10_000)
        assert await card.locator("button").all_inner_texts() == ["Agent Timeline"]
        await page.select_option("#lang", "zh_cn")
        assert "已停止" in await card.inner_text()
    for _ in range(3):  # the card, then its update (due once the card's update interval has passed)
        await hub.alerts.worker.deliver_once()  # the console's own application is delivered like any channel's
        hub.clock.advance(60)
    async with hub.db.read() as conn:
        notices = (await conn.execute(sa.select(outbox.c.kind, outbox.c.state, outbox.c.message_id,
                                                outbox.c.request_uuid).where(outbox.c.app_id == "cli_console"))).all()
    sent = [n for n in notices if n.kind in ("chat_card", "chat_part")]
    assert sent and all(n.state == "sent" for n in notices), notices  # confirmed, none left unconfirmed or queued
    assert all(n.message_id == f"om_console_{n.request_uuid}" for n in sent), sent
