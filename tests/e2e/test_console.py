"""The bot console in headless Chromium: `/amux`, click through personal schedules and back, as a user and the admin."""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path
from typing import AsyncIterator

import pytest
from aiohttp import web
from playwright.async_api import Browser, Page, async_playwright

from hub.app import Hub
from hub.clock import ManualClock
from hub.config import FeishuAppSettings
from hub.ids import new_id
from hub.services.auth import Caller
from hub.services.schedules import ScheduleSpec
from hub.store.db import Database
from hub.store.tables import identity_bindings, runtimes
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


@pytest.fixture
async def console(sqlite_url: str, tmp_path: Path, clock: ManualClock):
    settings = hub_settings(sqlite_url, tmp_path)
    settings.feishu.apps = [FeishuAppSettings(app_id="cli_demo", app_secret="s", verification_token="vt",
                                              admin_open_id="ou_boss", base_url="http://127.0.0.1:9")]
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
    port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001
    yield hub, f"http://127.0.0.1:{port}", admin, user
    await runner.cleanup()
    await hub.db.close()


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
        assert await card.locator("button").all_inner_texts() == ["Personal schedules"]

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
        assert await boss.locator("button").all_inner_texts() == ["Personal schedules", "Alert center"]
        await boss.locator("button", has_text="Alert center").click()
        await boss.locator("header", has_text="Alert center").wait_for()
        assert "No active incidents." in await boss.inner_text()
