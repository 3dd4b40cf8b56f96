"""The Boxes page over real HTTP: its own revocable sessions (never the API token in a cookie), unsandboxed boxes
say so, and pages (most recent activity first, keyed cursors, one query a page)."""
from __future__ import annotations

import contextlib
import hashlib
import logging
import re
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
from hub.services.auth.service import Caller
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
    port = site._server.sockets[0].getsockname()[1]
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
    assert (await get_page(h["url"],
                           await h["hub"].auth.create_token("alice"))).status_code == 401  # a token is no cookie
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


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="install bubblewrap (make test does)")
async def test_a_box_killed_from_inside_is_listed_dead_by_rift_vm_list_and_the_boxes_page(h):
    token = await h["hub"].auth.create_token("alice")
    async with mcp_client(h["url"], token, name="Claude") as c:
        t = (await c.call_tool("rift_task_new", {"name": "doomed"})).structured_content
        doomed = (await c.call_tool("rift_vm_new", {"task": t["handle"], "name": "doomed"})).structured_content
        fine = (await c.call_tool("rift_vm_new", {"task": t["handle"], "name": "fine"})).structured_content
        await c.call_tool("rift_vm_exec", {"task": t["handle"], "vm_id": doomed["vm_id"], "command": "kill -9 -1"})
        listed = {b["vm_id"]: b for b in
                  (await c.call_tool("rift_vm_list", {"task": t["handle"]})).structured_content["boxes"]}
        assert listed[doomed["vm_id"]]["state"] == "dead"
        assert "no longer running" in listed[doomed["vm_id"]]["warning"]
        assert "rift_vm_destroy" in listed[doomed["vm_id"]]["warning"]
        assert listed[fine["vm_id"]]["state"] == "live" and listed[fine["vm_id"]]["warning"] is None
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:
            page = (await http.get(f"{h['url']}/boxes")).text
        rows = {m.group(1): m.group(0) for m in re.finditer(r'<tr data-box="(vm_[0-9a-z]+)">.*?</tr>', page)}
        assert 'class="dead">dead<' in rows[doomed["vm_id"]] and "rift_vm_destroy" in rows[doomed["vm_id"]]
        assert "dead" not in rows[fine["vm_id"]] and "<td>live</td>" in rows[fine["vm_id"]]
        # listing changed nothing: the dead box is still the task's until it is destroyed
        gone = (await c.call_tool("rift_vm_destroy", {"task": t["handle"], "vm_id": doomed["vm_id"]}))
        assert gone.structured_content["state"] == "destroyed"
        await c.call_tool("rift_task_close", {"task": t["handle"]})


# ---------------------------------------------------------------- pages


async def open_tasks(hub: Hub, caller: Caller, names: list[str], boxes_each: int = 1) -> list[str]:
    """Open tasks one minute apart (each with `boxes_each` live box rows); return their ids, newest first."""
    ids = []
    for name in names:
        hub.clock.advance(minutes=1)
        task_id = (await hub.leases.new(caller, name))["task_id"]
        async with hub.db.write() as conn:
            for j in range(boxes_each):
                await hub.leases.store.add_box(conn, box_id=f"vm_{task_id[5:]}{j}", task_id=task_id, name=None,
                                               driver="local", provisional={}, now=hub.clock.now())
                await hub.leases.store.box_made(conn, f"vm_{task_id[5:]}{j}", {})
        ids.append(task_id)
    return ids[::-1]


def shown(html: str) -> tuple[list[str], list[str]]:
    """Return the task ids of the tasks table and the box ids of the boxes table, in page order."""
    return re.findall(r'<tr data-task="([^"]+)"', html), re.findall(r'<tr data-box="([^"]+)"', html)


def link(html: str, rel: str) -> str | None:
    m = re.search(rf'<a id="{rel}" rel="(?:prev|next)" href="([^"]+)"', html)
    return m.group(1).replace("&amp;", "&") if m else None


@pytest.fixture
async def paged(sqlite_url: str, tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    async with page_hub(sqlite_url, tmp_path / "home", boxes=BoxSettings(page_size=3)) as served:
        yield served


async def test_the_boxes_page_pages_most_recent_activity_first_with_links_both_ways(paged):
    hub, token = paged["hub"], await paged["hub"].auth.create_token("alice")
    ids = await open_tasks(hub, await hub.auth.authenticate(token), [f"t{i}" for i in range(7)])
    async with httpx2.AsyncClient(base_url=paged["url"], headers={"Authorization": f"Bearer {token}"}) as http:
        pages, url = [], "/boxes"
        while url:
            html = (await http.get(url)).text
            pages.append(html)
            url = link(html, "older")
        assert [shown(p)[0] for p in pages] == [ids[0:3], ids[3:6], ids[6:7]]
        assert [shown(p)[1] for p in pages] == [[f"vm_{t[5:]}0" for t in reversed(part)]
                                                for part in (ids[0:3], ids[3:6], ids[6:7])]  # boxes oldest first
        assert "7 open tasks · this page: 3 tasks with 3 boxes" in pages[0] and "7 open tasks" in pages[2]
        assert link(pages[0], "newer") is None and 'id="newest"' not in pages[0]
        back = (await http.get(link(pages[2], "newer"))).text
        assert shown(back)[0] == ids[3:6] and shown((await http.get(link(back, "newer"))).text)[0] == ids[0:3]


async def test_a_boxes_page_stays_put_when_tasks_open_above_it(paged):
    hub, token = paged["hub"], await paged["hub"].auth.create_token("alice")
    caller = await hub.auth.authenticate(token)
    ids = await open_tasks(hub, caller, [f"t{i}" for i in range(6)])
    async with httpx2.AsyncClient(base_url=paged["url"], headers={"Authorization": f"Bearer {token}"}) as http:
        older = link((await http.get("/boxes")).text, "older")
        newest = await open_tasks(hub, caller, ["fresh"])
        assert shown((await http.get(older)).text)[0] == ids[3:6]
        assert shown((await http.get("/boxes")).text)[0] == [newest[0], *ids[0:2]]


async def test_a_boxes_page_is_one_database_statement(paged):
    hub, token = paged["hub"], await paged["hub"].auth.create_token("alice")
    await open_tasks(hub, await hub.auth.authenticate(token), [f"t{i}" for i in range(7)], boxes_each=2)
    statements: list[str] = []

    def count(_conn, _cursor, statement, *_args) -> None:
        if not statement.lstrip().upper().startswith(("BEGIN", "COMMIT", "ROLLBACK")):
            statements.append(statement)

    async with httpx2.AsyncClient(base_url=paged["url"], headers={"Authorization": f"Bearer {token}"}) as http:
        older = link((await http.get("/boxes")).text, "older")  # also verifies the token once (then cached)
        sa.event.listen(hub.db.sync_engine, "before_cursor_execute", count)
        try:
            for url in ("/boxes", older, link((await http.get(older)).text, "newer")):
                statements.clear()
                assert (await http.get(url)).status_code == 200
                assert len(statements) == 1 and "lease_tasks" in statements[0], statements
        finally:
            sa.event.remove(hub.db.sync_engine, "before_cursor_execute", count)


async def test_another_users_tasks_never_show_on_any_page(paged):
    hub = paged["hub"]
    alice, bob = await hub.auth.create_token("alice"), await hub.auth.create_token("bob")
    a, b = await hub.auth.authenticate(alice), await hub.auth.authenticate(bob)
    mine, theirs = [], []
    for i in range(4):  # interleaved in time, so every page boundary has a neighbour of the other user
        mine += await open_tasks(hub, a, [f"alice {i}"])
        theirs += await open_tasks(hub, b, [f"bob {i}"])
    async with httpx2.AsyncClient(base_url=paged["url"], headers={"Authorization": f"Bearer {alice}"}) as http:
        seen, url = [], "/boxes"
        while url:
            html = (await http.get(url)).text
            assert "bob" not in html.replace('id="principal">alice', "")
            seen += shown(html)[0]
            url = link(html, "older")
        forged = (await http.get("/boxes", params={"after": f"9999999999999999.{theirs[0]}"})).text
        forged_up = (await http.get("/boxes", params={"before": f"0.{theirs[-1]}"})).text
    assert seen == mine[::-1] and "4 open tasks" in forged
    assert set(shown(forged)[0]) | set(shown(forged_up)[0]) <= set(mine)
    assert not set(theirs) & {*shown(forged)[1], *shown(forged_up)[1], *shown(forged)[0], *shown(forged_up)[0]}


@pytest.mark.parametrize("query", [{"after": "yesterday"}, {"before": "12.task_UPPER"}, {"after": "1.vm_x"},
                                   {"after": "1.task_a", "before": "2.task_b"}])
async def test_a_bad_page_cursor_answers_400_naming_the_fix(paged, query):
    token = await paged["hub"].auth.create_token("alice")
    async with httpx2.AsyncClient(base_url=paged["url"], headers={"Authorization": f"Bearer {token}"}) as http:
        resp = await http.get("/boxes", params=query)
    assert resp.status_code == 400 and resp.headers["content-type"].startswith("text/html")
    assert "Boxes page" in resp.text and "links" in resp.text
