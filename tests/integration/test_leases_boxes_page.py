"""The Boxes page over real HTTP: its own revocable sessions (never the API token in a cookie), and unsandboxed boxes say so."""
from __future__ import annotations

import contextlib
import hashlib
import logging
import shutil
from pathlib import Path
from typing import Any, AsyncIterator

import httpx2
import pytest
import sqlalchemy as sa
from aiohttp import web

from hub.app import Hub
from hub.clock import ManualClock
from hub.config import BoxSettings
from hub.domain.leases import UNSANDBOXED
from hub.store.db import Database
from hub.store.tables import api_tokens, box_sessions
from tests.helpers import hub_settings, mcp_client
from tests.integration.test_box_escape import destroy_live_boxes


@contextlib.asynccontextmanager
async def page_hub(db_url: str, home: Path, public_url: str | None = None,
                   boxes: BoxSettings | None = None) -> AsyncIterator[dict[str, Any]]:
    """Serve a hub with the given public_url and box settings."""
    settings = hub_settings(db_url, home)
    settings.public_url = public_url
    settings.boxes = boxes or BoxSettings()
    hub = Hub(settings, Database(db_url), ManualClock())
    runner = web.AppRunner(hub.web_app(background=False), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001
    try:
        yield {"url": f"http://127.0.0.1:{port}", "hub": hub}
    finally:
        await destroy_live_boxes(hub)
        await runner.cleanup()
        await hub.db.close()


@pytest.fixture
async def h(sqlite_url: str, tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    async with page_hub(sqlite_url, tmp_path / "home") as served:
        yield served


async def sign_in(url: str, token: str) -> httpx2.Response:
    async with httpx2.AsyncClient(follow_redirects=False) as http:
        return await http.get(f"{url}/boxes", params={"token": token})


def cookie_of(resp: httpx2.Response) -> tuple[str, str]:
    """Return the amux_boxes cookie's value and its whole Set-Cookie header."""
    header = next(v for k, v in resp.headers.multi_items() if k.lower() == "set-cookie" and v.startswith("amux_boxes="))
    return header.split(";", 1)[0].split("=", 1)[1].strip('"'), header


async def get_page(url: str, cookie: str) -> httpx2.Response:
    async with httpx2.AsyncClient(follow_redirects=False, cookies={"amux_boxes": cookie}) as http:
        return await http.get(f"{url}/boxes")


async def test_the_boxes_cookie_holds_a_hashed_revocable_session_never_the_api_token(h):
    token = await h["hub"].auth.create_token("alice")
    resp = await sign_in(h["url"], token)
    assert resp.status_code == 303 and resp.headers["location"] == "/boxes"
    value, header = cookie_of(resp)
    secret = token.rsplit(".", 1)[1]
    assert token not in value and secret not in value and value.startswith("bxs_")
    attrs = {a.strip().split("=")[0].lower() for a in header.split(";")[1:]}
    assert {"httponly", "samesite", "path", "max-age"} <= attrs and "samesite=strict" in header.lower()
    assert "secure" not in attrs  # plain http and no https public_url
    async with h["hub"].db.read() as conn:
        row = (await conn.execute(sa.select(box_sessions))).one()
    session_id, session_secret = value.split(".", 1)
    assert row.id == session_id and row.session_hash == hashlib.sha256(session_secret.encode()).hexdigest()
    assert session_secret not in str(tuple(row)) and token not in str(tuple(row))
    page = await get_page(h["url"], value)
    assert page.status_code == 200 and '<span id="principal">alice</span>' in page.text


async def test_signing_out_revokes_the_session(h):
    value, _ = cookie_of(await sign_in(h["url"], await h["hub"].auth.create_token("alice")))
    async with httpx2.AsyncClient(follow_redirects=False, cookies={"amux_boxes": value}) as http:
        out = await http.post(f"{h['url']}/boxes/signout")
    assert out.status_code == 303
    again = await get_page(h["url"], value)
    assert again.status_code == 401 and "sign in again" in again.text


async def test_revoking_the_api_token_ends_the_pages_sessions_it_opened(h):
    token = await h["hub"].auth.create_token("alice")
    value, _ = cookie_of(await sign_in(h["url"], token))
    assert (await get_page(h["url"], value)).status_code == 200
    async with h["hub"].db.write() as conn:
        await conn.execute(api_tokens.update().values(revoked_at=h["hub"].clock.now()))
    assert (await get_page(h["url"], value)).status_code == 401


async def test_an_expired_or_forged_session_signs_nobody_in(h):
    value, _ = cookie_of(await sign_in(h["url"], await h["hub"].auth.create_token("alice")))
    session_id = value.split(".", 1)[0]
    assert (await get_page(h["url"], f"{session_id}.{'x' * 43}")).status_code == 401
    assert (await get_page(h["url"], await h["hub"].auth.create_token("alice"))).status_code == 401  # a token is no cookie
    h["hub"].clock.advance(hours=13)
    assert (await get_page(h["url"], value)).status_code == 401


async def test_the_cookie_is_secure_when_the_public_url_is_https(sqlite_url, tmp_path):
    async with page_hub(sqlite_url, tmp_path / "home", public_url="https://hub.example.com") as hh:
        _, header = cookie_of(await sign_in(hh["url"], await hh["hub"].auth.create_token("alice")))
    assert "secure" in {a.strip().lower() for a in header.split(";")[1:]}


async def test_unsandboxed_boxes_say_so_in_the_log_in_rift_vm_list_and_on_the_page(sqlite_url, tmp_path, caplog):
    caplog.set_level(logging.WARNING)
    async with page_hub(sqlite_url, tmp_path / "home", boxes=BoxSettings(driver="unsandboxed")) as hh:
        assert any(r.levelno == logging.WARNING and "NOT sandboxed" in r.getMessage() for r in caplog.records)
        token = await hh["hub"].auth.create_token("alice")
        async with mcp_client(hh["url"], token, name="Claude") as c:
            t = (await c.call_tool("rift_task_new", {"name": "plain"})).structured_content
            made = (await c.call_tool("rift_vm_new", {"task": t["handle"]})).structured_content
            await c.call_tool("rift_vm_new", {"task": t["handle"]})
            listed = (await c.call_tool("rift_vm_list", {"task": t["handle"]})).structured_content["boxes"]
        assert made["driver"] == "unsandboxed" and made["warning"] == UNSANDBOXED and not made["sandboxed"]
        assert len(listed) == 2 and all(b["warning"] == UNSANDBOXED and not b["sandboxed"] for b in listed)
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
            page = (await http.get(f"{hh['url']}/boxes")).text
        assert "NOT SANDBOXED" in page and page.count("not sandboxed</span>") == 2
        async with mcp_client(hh["url"], token, name="Claude") as c:
            await c.call_tool("rift_task_close", {"task": t["handle"]})


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="install bubblewrap (make test does)")
async def test_sandboxed_boxes_carry_no_warning_and_report_their_isolation(h):
    async with mcp_client(h["url"], await h["hub"].auth.create_token("alice"), name="Claude") as c:
        t = (await c.call_tool("rift_task_new", {"name": "boxed"})).structured_content
        box = (await c.call_tool("rift_vm_new", {"task": t["handle"]})).structured_content
        listed = (await c.call_tool("rift_vm_list", {"task": t["handle"]})).structured_content["boxes"]
        await c.call_tool("rift_task_close", {"task": t["handle"]})
    assert box["sandboxed"] and box["warning"] is None and box["sandbox"] == "bwrap" and box["network"] == "none"
    assert set(box["limits"]) == {"memory", "pids", "cpu"} and listed[0]["warning"] is None
