"""The Agent Timeline page in headless Chromium: sign-in like the Boxes page, a Feishu login link that lands on it,
what it shows, and the 404 for anyone else's run."""
from __future__ import annotations

import shutil
from urllib.parse import quote

import pytest

from hub.errors import Invalid
from hub.services.tasks.service import SubmitRequest
from tests.e2e.test_boxes_page import chromium
from tests.helpers import start_hub

CHROMIUM = "/usr/bin/chromium"
SCRIPT = "say looking <b>bold</b>\ntool Bash 'grep -rn TODO src'\nsay done"

pytestmark = pytest.mark.skipif(shutil.which(CHROMIUM) is None, reason="install it: apt-get install -y chromium")


@pytest.fixture
async def hub(sqlite_url, tmp_path, clock):
    handle = await start_hub(sqlite_url, tmp_path, clock)
    await handle.start_runner()
    yield handle
    await handle.stop()


async def alices_task(hub) -> tuple[str, str]:
    token = await hub.token("alice")
    caller = await hub.hub.auth.authenticate(token)
    sub = await hub.hub.tasks.submit(caller, SubmitRequest(prompt=SCRIPT, profile="scripted"))
    assert (await hub.hub.tasks.wait_terminal(caller, sub["task_id"], timeout_s=20))["status"] == "succeeded"
    return token, sub["task_id"]


async def test_the_timeline_page_signs_in_like_the_boxes_page_and_shows_the_raw_events(hub):
    token, task_id = await alices_task(hub)
    async with chromium() as browser:
        ctx = await browser.new_context()
        page = await ctx.new_page()
        resp = await page.goto(f"{hub.url}/timeline/tasks/{task_id}?token={token}")
        assert resp.status == 200 and page.url == f"{hub.url}/timeline/tasks/{task_id}"  # the token left the URL
        cookie = next(c for c in await ctx.cookies() if c["name"] == "amux_timeline")
        assert cookie["httpOnly"] and token not in cookie["value"]
        assert await page.text_content("#principal") == "alice"
        assert await page.text_content("#status") == "succeeded"
        tool = page.locator('li[data-type="tool"]')
        assert await tool.count() == 1
        assert "grep -rn TODO src" in await tool.inner_text() and "Bash done" in await tool.inner_text()
        texts = page.locator('li[data-type="text"] pre')
        assert await texts.all_inner_texts() == ["looking <b>bold</b>", "done"]  # escaped, shown as written
        assert await page.locator("b:text('bold')").count() == 0
        await ctx.close()


async def test_another_users_timeline_page_is_404_and_an_anonymous_visit_asks_to_sign_in(hub):
    _token, task_id = await alices_task(hub)
    bob = await hub.token("bob")
    async with chromium() as browser:
        page = await browser.new_page()
        assert (await page.goto(f"{hub.url}/timeline/tasks/{task_id}")).status == 401
        assert (await page.goto(f"{hub.url}/timeline/tasks/{task_id}?token={bob}")).status == 404
        assert "does not exist or is not yours" in await page.text_content("#error")
        assert (await page.goto(f"{hub.url}/timeline/turns/{task_id}")).status == 404  # bob's session, not a turn


async def test_a_feishu_login_link_lands_on_the_timeline_page_without_a_token_in_the_url(hub):
    _token, task_id = await alices_task(hub)
    alice = await hub.hub.auth.authenticate(_token)
    link = await hub.hub.oauth.issue_login_link(alice.principal_id, hub.url, f"/timeline/tasks/{task_id}")
    assert "amux." not in link and link.endswith(f"&next=/timeline/tasks/{task_id}")
    async with chromium() as browser:
        page = await browser.new_page()
        await page.goto(link)
        await page.click("button")
        await page.wait_for_url(f"{hub.url}/timeline/tasks/{task_id}")
        assert await page.text_content("#principal") == "alice"
        assert await page.locator('li[data-type="tool"]').count() == 1


async def test_a_login_link_never_lands_outside_the_timeline_pages(hub):
    _token, task_id = await alices_task(hub)
    alice = await hub.hub.auth.authenticate(_token)
    with pytest.raises(Invalid, match="can land only on a timeline page"):
        await hub.hub.oauth.issue_login_link(alice.principal_id, hub.url, "https://evil.example/x")
    link = await hub.hub.oauth.issue_login_link(alice.principal_id, hub.url)
    async with chromium() as browser:
        page = await browser.new_page()
        await page.goto(f"{link}&next={quote('//evil.example/timeline/tasks/x', safe='')}")  # a hand-edited next
        await page.click("button")
        await page.wait_for_load_state()
        assert page.url.startswith(hub.url) and "Signed in as" in await page.content()
