"""`GET /timeline/tasks/{id}` and `GET /timeline/turns/{id}`: the Agent Timeline page, read-only, server-rendered.

Signing in is the Boxes page's (hub/web/boxes.py): an `Authorization` header, or `?token=` once (the page opens a
revocable session of its own in an HttpOnly cookie and drops the token from the address), or — for a Feishu user —
the one-time login link (`/amux login`, a card's Timeline button) whose `next` lands here with a browser session.
Only the run's owner and admins see it; anyone else gets the same 404 as for a run that does not exist.
"""
from __future__ import annotations

import json
from html import escape
from typing import Any, Literal

from aiohttp import web

from ..errors import AmuxError
from ..services.auth.service import AuthService, Caller, run_token_refusal
from ..services.leases.box_sessions import SESSION_TTL_S, BoxSessionService
from ..services.auth.oauth import OAuthService
from ..services.tasks.timeline import TimelineService
from .boxes import HEADERS, STYLE, _secure

COOKIE = "amux_timeline"
PATH = "/timeline"
PAGE_STYLE = STYLE + """
ol{padding-left:1.4rem}li{margin:.5rem 0;border-bottom:1px solid #eee;padding-bottom:.4rem}
.type{font-weight:600;margin-right:.4rem}.at{color:#6e6e73;font-size:12px}
pre{white-space:pre-wrap;word-break:break-word;background:#f5f5f7;padding:.4rem .6rem;border-radius:4px;
max-height:24rem;overflow:auto;font:12px ui-monospace,monospace;margin:.3rem 0}
.k{color:#6e6e73;font-size:12px;margin-top:.3rem}
"""


def _block(label: str, value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, indent=2)
    return f'<div class="k">{escape(label)}</div><pre>{escape(text)}</pre>'


def _event(e: dict[str, Any]) -> str:
    """Render one raw event: what the agent said, or a tool with its input, output, diff and locations."""
    kind = str(e.get("type") or "")
    head = (f'<li data-seq="{int(e.get("seq") or 0)}" data-type="{escape(kind)}"><span class="type">'
            f'{escape(kind)}</span><span class="at">{escape(str(e.get("at") or ""))}</span>')
    if kind == "tool" and isinstance(e.get("tool"), dict):
        tool = e["tool"]
        parts = [f' <code>{escape(str(tool.get("name") or ""))}</code> {escape(str(tool.get("title") or ""))} '
                 f'<span class="muted">({escape(str(tool.get("status") or ""))})</span>']
        for key in ("input", "output", "diff", "locations"):
            if tool.get(key) not in (None, "", [], {}):
                parts.append(_block(key, tool[key]))
        return head + "".join(parts) + "</li>"
    if isinstance(e.get("text"), str):
        return head + _block("text", e["text"]) + "</li>"
    rest = {k: v for k, v in e.items() if k not in ("seq", "type", "at")}
    return head + (_block("data", rest) if rest else "") + "</li>"


def render_page(caller: Caller, kind: str, view: dict[str, Any]) -> str:
    """Render a run's timeline: who is signed in, the run's status, then each raw event in order."""
    run_id = escape(str(view.get(f"{kind}_id") or ""))
    days = f"{float(view.get('retention_s') or 0) / 86400:g}"
    events = view.get("events") or []
    body = ("".join(_event(e) for e in events) if events else
            '<p class="muted" id="empty">No agent events recorded for this run (yet, or any more: '
            f"events are kept {days} days).</p>")
    more = (f'<p id="more"><a href="?cursor={int(view.get("cursor") or 0)}">Later events →</a></p>'
            if not view.get("done") and events else "")
    return ('<!doctype html><html lang="en"><head><meta charset="utf-8">'
            f"<title>Timeline {run_id} · amux</title>"
            f'<meta name="viewport" content="width=device-width"><style>{PAGE_STYLE}</style></head><body>'
            f'<h1>Agent Timeline</h1><p class="muted">Signed in as <span id="principal">{escape(caller.principal)}'
            f'</span> · {escape(kind)} <code id="run">{run_id}</code> · status <span id="status">'
            f'{escape(str(view.get("status") or ""))}</span> · kept {days} days</p>'
            '<p class="help">What the agent did, as it did it: tool input and output, diffs and text. Credential '
            "values and tokens are shown as [redacted].</p>"
            f'<ol id="events">{body}</ol>{more}</body></html>')


def _message(title: str, message: str, status: int) -> web.Response:
    html = (f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{escape(title)} · amux</title>'
            f'<style>{PAGE_STYLE}</style></head><body><h1>Agent Timeline</h1><p id="error">{escape(message)}</p>'
            "<p>Sign in with <code>?token=&lt;your token&gt;</code> once (the page keeps a session of its own in an "
            "HttpOnly cookie and drops the token from the address), send <code>Authorization: Bearer "
            "&lt;token&gt;</code>, or in Feishu press the card's Timeline button (or send <code>/amux login</code>) "
            "for a one-time sign-in link.</p></body></html>")
    return web.Response(text=html, content_type="text/html", status=status, headers=HEADERS)


def add_routes(app: web.Application, auth: AuthService, oauth: OAuthService, timeline: TimelineService,
               sessions: BoxSessionService, public_url: str | None = None) -> None:
    """Register the timeline pages."""

    async def caller_of(request: web.Request) -> Caller | web.Response:
        header = request.headers.get("Authorization") or request.query.get("token")
        if header:
            try:
                caller = await auth.authenticate(header)
            except AmuxError as e:
                return _message("Sign in", e.message, 401)
            refusal = run_token_refusal(caller, "tasks", read=True, what="the Agent Timeline page")
            return _message("Sign in", refusal, 401) if refusal else caller
        cookie = request.cookies.get(COOKIE) or ""
        session = await sessions.resolve(cookie)
        if session is None and cookie:
            signed_in = await oauth.session_principal(cookie)  # a Feishu user's one-time login link
            if signed_in is not None:
                session = Caller(signed_in[0], signed_in[1], "", "feishu-login", False)
        if session is None:
            return _message("Sign in", "Your timeline session ended (expired or revoked); sign in again."
                            if cookie else "Sign in to see this timeline.", 401)
        return session

    async def page(request: web.Request) -> web.StreamResponse:
        kind: Literal["task", "turn"] = "task" if request.match_info["kind"] == "tasks" else "turn"
        caller = await caller_of(request)
        if isinstance(caller, web.Response):
            return caller
        if request.query.get("token") and not request.headers.get("Authorization"):
            cookie = await sessions.open(caller)
            if cookie is None:
                return _message("Sign in", "This token cannot sign in to pages; use a user token "
                                           "(`amux token create --principal NAME`).", 401)
            resp = web.Response(status=303, headers={**HEADERS, "Location": request.path})
            resp.set_cookie(COOKIE, cookie, max_age=SESSION_TTL_S, path=PATH, httponly=True, samesite="Strict",
                            secure=_secure(request, public_url))
            return resp
        try:
            cursor = int(request.query.get("cursor") or 0)
        except ValueError:
            return _message("Bad cursor", "cursor must be a non-negative integer (the page's own Later link)", 400)
        try:
            view = await timeline.read(caller, kind, request.match_info["id"], cursor)
        except AmuxError as e:
            return _message("Not found" if e.status == 404 else "Refused", e.message, e.status)
        return web.Response(text=render_page(caller, kind, view), content_type="text/html", headers=HEADERS)

    app.router.add_get(r"/timeline/{kind:tasks|turns}/{id}", page)


def land(resp: web.StreamResponse, session: str, max_age: int, secure: bool) -> None:
    """Give a browser that just spent a login link whose `next` is a timeline page the session cookie of the page."""
    resp.set_cookie(COOKIE, session, max_age=max_age, path=PATH, httponly=True, samesite="Lax", secure=secure)
