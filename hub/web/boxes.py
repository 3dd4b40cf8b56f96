"""`GET /boxes`: the read-only Boxes page — a user's open lease tasks and their boxes, server-rendered."""
from __future__ import annotations

from datetime import datetime, timezone
from html import escape
from typing import Any
from urllib.parse import quote

from aiohttp import web

from ..clock import Clock
from ..domain.durations import duration_text
from ..domain.leases import DEAD, UNSANDBOXED, ago
from ..errors import AmuxError
from ..services.auth.service import AuthService, Caller, run_token_refusal
from ..services.leases.box_sessions import SESSION_TTL_S, BoxSessionService
from ..services.leases.service import BoxesPage, LeaseService

COOKIE = "amux_boxes"
COOKIE_MAX_AGE_S = SESSION_TTL_S
HEADERS = {
    # form-action 'self': the one form, sign-out, posts here (a cross-site post carries no SameSite=Strict cookie)
    "Content-Security-Policy": ("default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
                                "frame-ancestors 'none'; base-uri 'none'"),
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}
STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:2rem;color:#1d1d1f;max-width:72rem}
h1{font-size:1.4rem;margin:0 0 .2rem}h2{font-size:1.1rem;margin:1.6rem 0 .4rem}
table{border-collapse:collapse;width:100%}
th,td{text-align:left;padding:.3rem .6rem;border-bottom:1px solid #e3e3e6;vertical-align:top}
th{background:#f5f5f7;font-weight:600}code{font:12px ui-monospace,monospace;background:#f5f5f7;padding:0 .2rem}
.muted{color:#6e6e73}.warn{background:#fff4e5;border:1px solid #f5c26b;padding:.5rem .8rem;border-radius:6px}
.unsandboxed{color:#a0522d;font-weight:600}.dead{color:#b22222;font-weight:600}
#pages{margin:.6rem 0}#pages a{margin-right:1rem}
.help{background:#f0f6ff;border:1px solid #c9defc;padding:.7rem 1rem;border-radius:6px}
#signout{margin:0 0 .8rem}#signout button{font:inherit;padding:.1rem .6rem;cursor:pointer}
"""
# Ends this browser's session only (POST /boxes/signout); nothing else on the page acts.
SIGNOUT = '<form id="signout" method="post" action="/boxes/signout"><button type="submit">Sign out</button></form>'

_EPOCH, _EPOCH_NAIVE = datetime(1970, 1, 1, tzinfo=timezone.utc), datetime(1970, 1, 1)
NO_BOXES = '<span class="muted">none</span>'
UNSANDBOXED_CELL = '<span class="unsandboxed">not sandboxed</span>'
DEAD_CELL = ('<span class="dead">dead</span> <span class="muted">(no longer running: ask your agent to '
             '<code>rift_vm_destroy</code> it)</span>')


def _t(dt: datetime | None) -> str:
    """Render a stored time as `YYYY-MM-DD HH:MM UTC` (naive ones, as SQLite returns them, are UTC already)."""
    if dt is None:
        return "—"
    if dt.tzinfo is not None:  # the same instant as naive UTC: half the cost of formatting an aware time
        dt = _EPOCH_NAIVE + (dt - _EPOCH)
    return f"{dt.isoformat(' ', 'minutes')} UTC"  # isoformat: a third of strftime's cost


def _help(auto_close_s: float) -> str:
    return (
        '<section class="help" id="help"><p><strong>This page only shows; it changes nothing.</strong> '
        "To put away boxes an agent left behind, ask your agent to call <code>rift_task_close</code> on the task, "
        "which destroys its boxes, or <code>rift_vm_destroy</code> on one box. "
        f"A task that is quiet for {duration_text(auto_close_s)} closes itself, and its boxes are destroyed.</p>"
        "<p>To hand a task to another agent: the holder calls <code>rift_task_release</code>, the other agent calls "
        "<code>rift_task_attach</code>; a task active lately needs <code>takeover</code> (ask first).</p></section>"
    )


def _plural(n: int, one: str, many: str) -> str:
    return f"{n} {one if n == 1 else many}"


def _nav(page: BoxesPage | None) -> str:
    """Links to the neighbouring pages (plain GET links; none when everything fits on one page)."""
    if page is None or (page.first and page.older is None):
        return ""
    links = []
    if not page.first:
        links.append('<a id="newest" href="/boxes">Most recent</a>')
    if page.newer is not None:
        links.append(f'<a id="newer" rel="prev" href="/boxes?before={quote(page.newer)}">← Newer</a>')
    if page.older is not None:
        links.append(f'<a id="older" rel="next" href="/boxes?after={quote(page.older)}">Older →</a>')
    return f'<nav id="pages">{"".join(links)}</nav>'


def _task_rows(tasks: list[Any], box_cells: dict[str, list[str]], now: datetime) -> list[str]:
    """Render the open tasks table's rows (every user-given string escaped: names, holder labels)."""
    now_naive = now.astimezone(timezone.utc).replace(tzinfo=None)  # to compare with SQLite's naive UTC times
    rows = []
    for t in tasks:
        holder = escape(t.holder_label or "—")
        if not t.held:
            holder = f'<span class="muted">released by {holder}</span>'
        tid, active = escape(t.id), t.last_activity_at
        rows.append(
            f'<tr data-task="{tid}"><td><code>{tid}</code></td><td>{escape(t.name)}</td>'
            f'<td class="holder">{holder}</td><td>{_t(t.attached_at)}</td>'
            f'<td class="activity">{_t(active)} '
            f'<span class="muted">({ago(active, now if active.tzinfo else now_naive)})</span></td>'
            f'<td class="boxes">{", ".join(box_cells.get(t.id, ())) or NO_BOXES}</td></tr>')
    return rows


def _box_rows(tasks: list[Any], boxes: list[Any], box_cells: dict[str, list[str]]) -> list[str]:
    """Render the boxes table's rows, and fill `box_cells` with each task's boxes as its row lists them (each
    string escaped once for both tables)."""
    task_cells = {t.id: f"<code>{escape(t.id)}</code> {escape(t.name)}" for t in tasks}
    known: dict[str, str] = {}  # driver names and states: a handful of values, escaped once a page
    rows = []
    for b in boxes:
        bid, name = escape(b.id), escape(b.name or "")
        box_cells.setdefault(b.task_id, []).append(f"<code>{bid}</code> {name}" if name else f"<code>{bid}</code>")
        driver = known.get(b.driver) or known.setdefault(b.driver, escape(b.driver))
        state = DEAD_CELL if b.state == DEAD else known.get(b.state) or known.setdefault(b.state, escape(b.state))
        task_cell = task_cells.get(b.task_id) or f"<code>{escape(b.task_id)}</code> "
        isolation = UNSANDBOXED_CELL if b.driver == "unsandboxed" else "sandboxed"
        rows.append(
            f'<tr data-box="{bid}"><td><code>{bid}</code></td><td>{name}</td><td class="task">{task_cell}</td>'
            f'<td>{driver}</td><td class="isolation">{isolation}</td><td>{state}</td>'
            f"<td>{_t(b.created_at)}</td></tr>")
    return rows


def render_page(caller: Caller, tasks: list[Any], boxes: list[Any], now: datetime, auto_close_s: float, *,
                page: BoxesPage | None = None, signout: bool = False) -> str:
    """Render the Boxes page: tasks with holder, last activity and boxes; boxes with their task.

    With `page`, `tasks` and `boxes` are one page of them: the header counts every open task and links the pages.
    With `signout` (a browser session signed the viewer in), the header carries the sign-out button.
    """
    n_tasks = page.open_tasks if page is not None else len(tasks)
    counts = f"{_plural(n_tasks, 'open task', 'open tasks')}, {_plural(len(boxes), 'box', 'boxes')}"
    if page is not None and len(tasks) != n_tasks:
        counts = (f"{_plural(n_tasks, 'open task', 'open tasks')} · this page: {_plural(len(tasks), 'task', 'tasks')}"
                  f" with {_plural(len(boxes), 'box', 'boxes')}")
    out = [
        '<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Boxes · amux</title>',
        f'<meta name="viewport" content="width=device-width"><style>{STYLE}</style></head><body>',
        f'<h1>Boxes</h1><p class="muted">Signed in as <span id="principal">{escape(caller.principal)}</span> · '
        f"{counts} · as of {_t(now)}</p>{SIGNOUT if signout else ''}",
        _help(auto_close_s),
    ]
    if page.unsandboxed if page is not None else any(b.driver == "unsandboxed" for b in boxes):
        out.append(f'<p class="warn" id="unsandboxed">{escape(UNSANDBOXED)}.</p>')
    out.append('<h2>Open tasks</h2>')
    box_cells: dict[str, list[str]] = {}
    box_rows = _box_rows(tasks, boxes, box_cells)
    if not tasks and n_tasks:
        out.append('<p class="muted" id="no-tasks">No open tasks on this page; see the most recent ones at '
                   '<code>/boxes</code>.</p>')
    elif not tasks:
        out.append('<p class="muted" id="no-tasks">No open tasks. An agent opens one with '
                   '<code>rift_task_new</code>.</p>')
    else:
        out.append('<table id="tasks"><thead><tr><th>Task</th><th>Name</th><th>Holder</th><th>Held since</th>'
                   '<th>Last activity</th><th>Boxes</th></tr></thead><tbody>')
        out += _task_rows(tasks, box_cells, now)
        out.append("</tbody></table>")
    out.append(_nav(page))
    out.append("<h2>Boxes</h2>")
    if not boxes:
        out.append('<p class="muted" id="no-boxes">No boxes. An agent claims one inside a task with '
                   '<code>rift_vm_new</code>.</p>')
    else:
        out.append('<table id="boxes"><thead><tr><th>Box</th><th>Name</th><th>Task</th><th>Driver</th>'
                   '<th>Isolation</th><th>State</th><th>Created</th></tr></thead><tbody>')
        out += box_rows
        out.append("</tbody></table>")
    out.append("</body></html>")
    return "".join(out)


def _message_page(message: str) -> str:
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Boxes · amux</title>'
            f'<style>{STYLE}</style></head><body><h1>Boxes</h1><p id="error">{escape(message)}</p></body></html>')


def _signin_page(message: str) -> str:
    return (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>Sign in · Boxes · amux</title>'
            f"<style>{STYLE}</style></head><body><h1>Boxes</h1><p>{escape(message)}</p>"
            "<p>Open <code>/boxes?token=&lt;your token&gt;</code> once (the page signs you in with a session of its "
            "own, kept in an HttpOnly cookie, and drops the token from the address), or send "
            "<code>Authorization: Bearer &lt;token&gt;</code>. "
            "Create a token with <code>amux token create --principal NAME</code>.</p></body></html>")


def _secure(request: web.Request, public_url: str | None) -> bool:
    """Return whether the cookie must be `Secure`: the hub is served over https, here or at its public address."""
    return request.secure or (public_url or "").lower().startswith("https://")


def add_routes(app: web.Application, auth: AuthService, leases: LeaseService, clock: Clock,
               public_url: str | None = None) -> None:
    """Register `GET /boxes` and `POST /boxes/signout`."""
    sessions = BoxSessionService(leases.db, clock)

    def unauthorized(request: web.Request, message: str) -> web.Response:
        resp = web.Response(text=_signin_page(message), content_type="text/html", status=401, headers=HEADERS)
        if request.cookies.get(COOKIE):
            resp.del_cookie(COOKIE, path="/boxes")
        return resp

    async def page(request: web.Request) -> web.Response:
        query_token = request.query.get("token")
        header = request.headers.get("Authorization") or query_token
        caller: Caller | None
        if header:
            try:
                caller = await auth.authenticate(header)
            except AmuxError as e:
                return unauthorized(request, e.message)
            refusal = run_token_refusal(caller, "leases", read=True, what="the Boxes page")  # as on REST and MCP
            if refusal is not None:
                return unauthorized(request, refusal)
        else:
            caller = await sessions.resolve(request.cookies.get(COOKIE))
            if caller is None:
                message = ("Your Boxes session ended (signed out, expired, or its token was revoked); sign in again."
                           if request.cookies.get(COOKIE) else "Sign in to see your boxes.")
                return unauthorized(request, message)
        if query_token and not request.headers.get("Authorization"):
            # Keep the token out of the address bar, history and cookie jar: the cookie holds a session of its own.
            cookie = await sessions.open(caller)
            if cookie is None:
                return unauthorized(request, "This token cannot sign in to pages; use a user token "
                                             "(`amux token create --principal NAME`).")
            resp = web.Response(status=303, headers={**HEADERS, "Location": "/boxes"})
            resp.set_cookie(COOKIE, cookie, max_age=COOKIE_MAX_AGE_S, path="/boxes", httponly=True,
                            samesite="Strict", secure=_secure(request, public_url))
            return resp
        try:
            page = await leases.boxes_page(caller.principal_id, leases.boxes.page_size,
                                           after=request.query.get("after"), before=request.query.get("before"))
        except AmuxError as e:
            return web.Response(text=_message_page(e.message), content_type="text/html", status=e.status,
                                headers=HEADERS)
        html = render_page(caller, page.tasks, page.boxes, clock.now(), leases.settings.auto_close_quiet_s, page=page,
                           signout=not header)
        return web.Response(text=html, content_type="text/html", headers=HEADERS)

    async def signout(request: web.Request) -> web.Response:
        """End this browser's session (the page itself stays read-only: no control on it changes anything)."""
        await sessions.revoke(request.cookies.get(COOKIE))
        resp = web.Response(status=303, headers={**HEADERS, "Location": "/boxes"})
        resp.del_cookie(COOKIE, path="/boxes")
        return resp

    app.router.add_get("/boxes", page)
    app.router.add_post("/boxes/signout", signout)
