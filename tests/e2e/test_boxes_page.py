"""The Boxes page in headless Chromium: what it shows, and that nothing on it changes anything."""
from __future__ import annotations

import contextlib
import shutil
from typing import AsyncIterator

import pytest
from playwright.async_api import Browser, async_playwright

from tests.helpers import mcp_client, start_hub
from tests.integration.test_box_escape import destroy_live_boxes

CHROMIUM = "/usr/bin/chromium"
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--no-first-run"]
ACTING = "form, button, input, select, textarea, [contenteditable], [onclick], script, a[href]"

pytestmark = pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="install it: apt-get install -y chromium")


@pytest.fixture
async def hub(sqlite_url, tmp_path, clock):  # noqa: ANN001, ANN201
    """Run a hub on a real port over SQLite; destroy the boxes a test leaves (they outlive a stopped hub by design)."""
    handle = await start_hub(sqlite_url, tmp_path, clock)
    yield handle
    await destroy_live_boxes(handle.hub)
    await handle.stop()


@contextlib.asynccontextmanager
async def chromium() -> AsyncIterator[Browser]:
    """Launch headless Chromium (inside the test's own task)."""
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=ARGS)
        try:
            yield browser
        finally:
            await browser.close()


async def call(client, tool: str, args: dict) -> dict:  # noqa: ANN001
    res = await client.call_tool(tool, args)
    assert not res.is_error, res.content[0].text
    return res.structured_content


async def seed(hub) -> dict:  # noqa: ANN001
    """Two agents of alice with tasks and boxes; bob with one task; return what was made."""
    alice1, alice2 = await hub.token("alice"), await hub.token("alice")
    made: dict = {"alice_token": alice1}
    async with mcp_client(hub.url, alice1, name="Claude") as claude, mcp_client(hub.url, alice2, name="Codex") as codex:
        web = await call(claude, "rift_task_new", {"name": "web <img src=x onerror=alert(1)> & co"})
        b1 = await call(claude, "rift_vm_new", {"task": web["handle"], "name": "frontend"})
        b2 = await call(claude, "rift_vm_new", {"task": web["handle"], "name": "<b>db</b>"})
        hub.clock.advance(minutes=5)
        api = await call(codex, "rift_task_new", {"name": "api"})
        b3 = await call(codex, "rift_vm_new", {"task": api["handle"]})
        gone = await call(codex, "rift_task_new", {"name": "finished work"})
        await call(codex, "rift_task_close", {"task": gone["handle"]})
        hub.clock.advance(minutes=3)
    async with mcp_client(hub.url, await hub.token("bob"), name="Claude") as bob:
        await call(bob, "rift_task_new", {"name": "bob's secret project"})
    made.update(web=web, api=api, gone=gone, boxes={b1["vm_id"]: web["task_id"], b2["vm_id"]: web["task_id"],
                                                    b3["vm_id"]: api["task_id"]})
    return made


async def test_the_boxes_page_shows_open_tasks_with_holder_activity_and_boxes_and_changes_nothing(hub):
    made = await seed(hub)
    async with chromium() as browser:
        ctx = await browser.new_context()
        page = await ctx.new_page()
        resp = await page.goto(f"{hub.url}/boxes?token={made['alice_token']}")
        assert resp.status == 200 and page.url == f"{hub.url}/boxes"  # the token left the address bar
        cookie = next(c for c in await ctx.cookies() if c["name"] == "amux_boxes")
        assert cookie["httpOnly"] and cookie["sameSite"] == "Strict"
        # a session, not the token
        assert made["alice_token"] not in cookie["value"] and cookie["value"].startswith("bxs_")
        assert await page.evaluate("document.cookie") == ""

        rows = page.locator("#tasks tbody tr")
        assert await rows.count() == 2  # the closed task and bob's task are not shown
        web_row = page.locator(f'#tasks tr[data-task="{made["web"]["task_id"]}"]')
        assert await web_row.locator("td").nth(1).inner_text() == "web <img src=x onerror=alert(1)> & co"
        assert await web_row.locator(".holder").inner_text() == "mcp:Claude"
        assert "2026-01-05 09:00 UTC" in await web_row.locator(".activity").inner_text()
        assert "8 min ago" in await web_row.locator(".activity").inner_text()
        api_row = page.locator(f'#tasks tr[data-task="{made["api"]["task_id"]}"]')
        assert await api_row.locator(".holder").inner_text() == "mcp:Codex"
        assert "3 min ago" in await api_row.locator(".activity").inner_text()
        for vm_id, task_id in made["boxes"].items():
            assert vm_id in await page.locator(f'#tasks tr[data-task="{task_id}"] .boxes').inner_text()
            assert (await page.locator(f'#boxes tr[data-box="{vm_id}"] .task').inner_text()).startswith(task_id)
        assert await page.locator("#boxes tbody tr").count() == 3

        body = await page.inner_text("body")
        assert "bob's secret project" not in body and made["gone"]["task_id"] not in body
        assert "<b>db</b>" in body and await page.locator("img, b").count() == 0  # user text is escaped
        help_text = await page.inner_text("#help")
        assert "rift_task_close" in help_text and "rift_vm_destroy" in help_text
        assert "quiet for 4 h closes itself" in help_text

        # no control that changes state: the one form ends this browser's session
        assert await page.locator(f":is({ACTING}):not(#signout, #signout button)").count() == 0
        assert await page.locator("#signout button").inner_text() == "Sign out"
        before = await hub.hub.leases.list(await hub.hub.auth.authenticate(made["alice_token"]))
        await page.reload()
        await page.mouse.click(10, 10)
        assert await hub.hub.leases.list(await hub.hub.auth.authenticate(made["alice_token"])) == before


async def test_the_boxes_page_needs_the_users_token(hub):
    await seed(hub)
    async with chromium() as browser:
        page = await browser.new_page()
        resp = await page.goto(f"{hub.url}/boxes")
        assert resp.status == 401 and "amux token create" in await page.inner_text("body")
        assert await page.locator(ACTING).count() == 0
        resp = await page.goto(f"{hub.url}/boxes?token=amux.bogus.token")
        assert resp.status == 401 and not any(c["name"] == "amux_boxes" for c in await page.context.cookies())
        ctx = await browser.new_context(extra_http_headers={"Authorization": f"Bearer {await hub.token('carol')}"})
        page = await ctx.new_page()
        resp = await page.goto(f"{hub.url}/boxes")
        assert resp.status == 200 and "No open tasks" in await page.inner_text("body")
        assert await page.inner_text("#principal") == "carol"
        assert await page.locator("#signout").count() == 0       # no session of the page's own to end


async def test_the_boxes_pages_sign_out_button_ends_the_session_and_the_page_then_asks_for_a_token(hub):
    made = await seed(hub)
    async with chromium() as browser:
        ctx = await browser.new_context()
        page = await ctx.new_page()
        await page.goto(f"{hub.url}/boxes?token={made['alice_token']}")
        session = next(c["value"] for c in await ctx.cookies() if c["name"] == "amux_boxes")
        assert await page.locator("#tasks tbody tr").count() == 2
        async with page.expect_navigation():
            await page.click("#signout button")
        assert page.url == f"{hub.url}/boxes"
        body = await page.inner_text("body")
        assert "Sign in to see your boxes." in body and "/boxes?token=<your token>" in body
        assert await page.locator("#tasks").count() == 0
        assert not any(c["name"] == "amux_boxes" for c in await ctx.cookies())
        # the session is revoked at the hub, not only forgotten by this browser
        await ctx.add_cookies([{"name": "amux_boxes", "value": session, "url": f"{hub.url}/boxes"}])
        resp = await page.goto(f"{hub.url}/boxes")
        assert resp.status == 401 and "Your Boxes session ended" in await page.inner_text("body")
