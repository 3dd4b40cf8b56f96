"""OAuth routes for hosted MCP clients: discovery (RFC 9728, RFC 8414), registration, the approval page, tokens.

The policy is `hub/services/auth/oauth.py`; this module speaks HTTP. The SDK's own handlers in
`mcp.server.auth` are Starlette endpoints that read wall-clock time, so they do not fit an aiohttp
hub whose durations come from the injected clock; the SDK's pydantic metadata models are reused.
"""
from __future__ import annotations

import base64
import hashlib
import html
from typing import Any
from urllib.parse import parse_qsl, unquote_plus, urlencode, urlsplit, urlunsplit

from aiohttp import web
from mcp.shared.auth import OAuthMetadata, ProtectedResourceMetadata

from ..domain.rate import retry_after
from ..domain.timeline import safe_next
from ..errors import AmuxError
from ..services.auth.service import AuthService, check_may_approve
from ..services.auth.oauth_registration import ClientRegistration, RegistrationLimited
from . import timeline_page
from ..logs import CLIENT
from ..services.auth.oauth import (SCOPE_TEXT, SCOPES, AuthorizeRequest, OAuthError, OAuthService, PageError,
                                   RedirectError)

SESSION_COOKIE = "amux_oauth_session"
NEXT_COOKIE = "amux_oauth_next"
CORS = {"Access-Control-Allow-Origin": "*", "Access-Control-Allow-Methods": "GET, POST, OPTIONS",
        "Access-Control-Allow-Headers": "Authorization, Content-Type, MCP-Protocol-Version"}
NO_STORE = {"Cache-Control": "no-store", "Pragma": "no-cache"}
PAGE_HEADERS = {**NO_STORE, "X-Frame-Options": "DENY", "Referrer-Policy": "no-referrer",
                "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'; frame-ancestors 'none'"}
AUTH_PARAMS = ("response_type", "client_id", "redirect_uri", "state", "code_challenge", "code_challenge_method",
               "scope", "resource")


class OAuthWeb:
    """The HTTP face of the hub's authorization server and of `/mcp` as a protected resource."""

    def __init__(self, oauth: OAuthService, auth: AuthService, public_url: str | None,
                 registration: ClientRegistration | None = None) -> None:
        self.oauth = oauth
        self.auth = auth
        self.registration = registration
        self.public_url = public_url.rstrip("/") if public_url else None

    def base(self, request: web.Request) -> str:
        """Return the hub's public base URL: `public_url` when configured, else what the request was sent to."""
        return self.public_url or f"{request.scheme}://{request.host}"

    def resources(self, request: web.Request) -> tuple[str, ...]:
        """Return the resource indicators that name this hub: its MCP endpoint first."""
        base = self.base(request)
        return f"{base}/mcp", base

    def challenge(self, request: web.Request, description: str | None) -> str:
        """Return the `WWW-Authenticate` value of a 401 from `/mcp` (RFC 6750 §3, RFC 9728 §5.1)."""
        base = self.base(request)
        value = f'Bearer resource_metadata="{base}/.well-known/oauth-protected-resource", scope="{" ".join(SCOPES)}"'
        if request.headers.get("Authorization"):  # RFC 6750 §3.1: no error code when no credentials were sent
            text = (description or "").replace("\\", "").replace('"', "'")
            value += f', error="invalid_token", error_description="{text}"'
        return value

    # ------------------------------------------------------------------ discovery

    async def protected_resource(self, request: web.Request) -> web.Response:
        """Serve RFC 9728 protected resource metadata for `/mcp`."""
        base = self.base(request)
        meta = ProtectedResourceMetadata.model_validate({  # the SDK's model validates the URLs
            "resource": f"{base}/mcp", "authorization_servers": [base], "scopes_supported": list(SCOPES),
            "resource_name": "amux hub"})
        return _json(meta.model_dump(mode="json", exclude_none=True), cache=True)

    async def authorization_server(self, request: web.Request) -> web.Response:
        """Serve RFC 8414 authorization server metadata."""
        base = self.base(request)
        meta = OAuthMetadata.model_validate(dict(  # the SDK's model validates the URLs
            issuer=base, authorization_endpoint=f"{base}/oauth/authorize", token_endpoint=f"{base}/oauth/token",
            registration_endpoint=f"{base}/oauth/register", revocation_endpoint=f"{base}/oauth/revoke",
            scopes_supported=list(SCOPES), response_types_supported=["code"],
            grant_types_supported=["authorization_code", "refresh_token"],
            token_endpoint_auth_methods_supported=["client_secret_basic", "client_secret_post", "none"],
            revocation_endpoint_auth_methods_supported=["client_secret_basic", "client_secret_post", "none"],
            code_challenge_methods_supported=["S256"], authorization_response_iss_parameter_supported=True))
        return _json(meta.model_dump(mode="json", exclude_none=True), cache=True)

    async def preflight(self, _request: web.Request) -> web.Response:
        """Answer a CORS preflight (browser-based MCP clients)."""
        return web.Response(status=204, headers={**CORS, "Access-Control-Max-Age": "86400"})

    # ------------------------------------------------------------------ registration and tokens

    async def register(self, request: web.Request) -> web.Response:
        """Register a client (RFC 7591): 201 with the client information; 429 past the per-address limit."""
        if (request.content_length or 0) > 64 * 1024:
            return _oauth_error(OAuthError("invalid_client_metadata", "client metadata is larger than 64 KiB"))
        try:
            if self.registration is not None:
                info = await self.registration.register(await request.read(), request.get(CLIENT, request.remote))
            else:
                info = await self.oauth.register(await request.read())
        except OAuthError as e:
            return _oauth_error(e)
        return _json(info, status=201)

    async def token(self, request: web.Request) -> web.Response:
        """Issue tokens for the authorization_code and refresh_token grants."""
        try:
            form = await request.post()
            client = await self.oauth.authenticate_client(*_client_credentials(request, form))
            grant = form.get("grant_type")
            if grant == "authorization_code":
                tokens = await self.oauth.exchange_code(
                    client, str(form.get("code") or ""), str(form.get("code_verifier") or ""),
                    _opt(form.get("redirect_uri")), _opt(form.get("resource")), self.resources(request))
            elif grant == "refresh_token":
                tokens = await self.oauth.refresh(client, str(form.get("refresh_token") or ""), _opt(form.get("scope")))
            else:
                raise OAuthError("unsupported_grant_type", "grant_type must be authorization_code or refresh_token")
        except OAuthError as e:
            return _oauth_error(e, basic=request.headers.get("Authorization", "")[:6].lower() == "basic ")
        return _json(tokens)

    async def revoke(self, request: web.Request) -> web.Response:
        """Revoke a token's grant (RFC 7009)."""
        try:
            form = await request.post()
            client = await self.oauth.authenticate_client(*_client_credentials(request, form))
            await self.oauth.revoke(client, str(form.get("token") or ""))
        except OAuthError as e:
            return _oauth_error(e)
        return web.Response(status=200, headers={**CORS, **NO_STORE})

    # ------------------------------------------------------------------ the approval page

    async def authorize(self, request: web.Request) -> web.StreamResponse:
        """Show the approval page (GET) or act on the user's decision (POST)."""
        form = await request.post() if request.method == "POST" else None
        params = {k: str((form or request.query).get(k)) for k in AUTH_PARAMS
                  if (form or request.query).get(k) is not None}
        try:
            req = await self.oauth.check_authorize(params, self.resources(request))
        except PageError as e:
            return _page("Cannot authorize", f'<p class="err">{html.escape(str(e))}</p>', status=400)
        except RedirectError as e:
            return _redirect_to(e.redirect_uri, {"error": e.error, "error_description": e.description, "state": e.state,
                                                 "iss": self.base(request)})
        session = request.cookies.get(SESSION_COOKIE)
        signed_in = await self.oauth.session_principal(session)
        if form is None:
            resp = self._approval_page(req, params, signed_in, session)
            resp.set_cookie(NEXT_COOKIE, request.path_qs, max_age=600, path="/oauth", httponly=True, samesite="Lax",
                            secure=self.base(request).startswith("https:"))
            return resp
        if form.get("decision") != "approve":
            return _redirect_to(req.redirect_uri, {"error": "access_denied", "error_description": "the user declined",
                                                   "state": req.state, "iss": self.base(request)})
        token = str(form.get("token") or "").strip()
        try:
            if token:
                approver = await self.auth.authenticate(token)  # an amux token pasted here
                check_may_approve(approver)
                principal_id, approved_by = approver.principal_id, approver.token_id
            elif signed_in and session and form.get("csrf") == _csrf(session):
                principal_id, approved_by = signed_in[0], None
            else:
                return self._approval_page(req, params, signed_in, session, status=401,
                                           error="Paste your amux token (or sign in with a Feishu login "
                                                 "link) to approve.")
        except AmuxError as e:
            return self._approval_page(req, params, signed_in, session, status=401, error=e.message)
        chosen = [s for s in req.scopes if s in form.getall("grant", [])]
        if not chosen:
            return self._approval_page(req, params, signed_in, session, status=400,
                                       error="Choose at least one permission.")
        code = await self.oauth.approve(req, principal_id, chosen, approved_by=approved_by)
        return _redirect_to(req.redirect_uri, {"code": code, "state": req.state, "iss": self.base(request)})

    def _approval_page(self, req: AuthorizeRequest, params: dict[str, str], signed_in: tuple[str, str] | None,
                       session: str | None, *, status: int = 200, error: str | None = None) -> web.Response:
        e = html.escape
        hidden = "".join(f'<input type="hidden" name="{e(k)}" value="{e(v)}">' for k, v in params.items())
        boxes = "".join(f'<label><input type="checkbox" name="grant" value="{s}" checked> <b>{s}</b> — '
                        f'{e(SCOPE_TEXT[s])}</label>'
                        for s in req.scopes)
        if signed_in and session:
            who = (f'<p>Signed in as <b>{e(signed_in[1])}</b>.</p><input type="hidden" name="csrf" '
                   f'value="{_csrf(session)}">'
                   '<p><small>Or approve as someone else with their token:</small></p>')
        else:
            who = ""
        host = urlsplit(req.redirect_uri).netloc or req.redirect_uri
        body = (
            f"<p><b>{e(req.client.name)}</b> asks to use amux on your behalf. After approval you return to "
            f"<code>{e(host)}</code>.</p>"
            + (f'<p class="err">{e(error)}</p>' if error else "")
            + '<form method="post" '
              f'action="/oauth/authorize">{hidden}<fieldset><legend>Allow</legend>{boxes}</fieldset>{who}'
            '<label>amux token <input type="password" name="token" autocomplete="off" placeholder="amux.…"></label>'
            '<p><small>No token at hand? Send <code>/amux login</code> to the amux bot in Feishu: it answers with a '
            'one-time sign-in link. Open it in this browser, then come back to this page.</small></p>'
            '<button name="decision" value="approve">Approve</button> <button name="decision" '
            'value="deny">Deny</button>'
            "</form>"
        )
        return _page("Connect to amux", body, status=status)

    async def login_page(self, request: web.Request) -> web.Response:
        """Show the one-time sign-in link's confirmation (a GET never spends the link: previews fetch links)."""
        code = html.escape(request.query.get("code", ""))
        nxt = safe_next(request.query.get("next"))
        purpose = ("see the Agent Timeline you asked for" if nxt else "approve MCP clients")
        landing = f'<input type="hidden" name="next" value="{html.escape(nxt)}">' if nxt else ""
        body = (f'<p>Sign in to the amux hub in this browser to {purpose}.</p>'
                f'<form method="post" action="/oauth/login"><input type="hidden" name="code" value="{code}">'
                f'{landing}<button>Sign in</button></form>')
        return _page("Sign in to amux", body)

    async def login(self, request: web.Request) -> web.StreamResponse:
        """Spend a one-time sign-in link, open a browser session, and go back to the pending approval."""
        form = await request.post()
        try:
            session, name = await self.oauth.redeem_login(str(form.get("code") or ""))
        except AmuxError as e:
            return _page("Sign-in failed", f'<p class="err">{html.escape(e.message)}</p>', status=401)
        landing = safe_next(form.get("next"))
        nxt = request.cookies.get(NEXT_COOKIE, "")
        secure = self.base(request).startswith("https:")
        max_age = int(self.oauth.session_ttl.total_seconds())
        if landing is not None:  # a timeline page (a card's Timeline button): that page's session cookie too
            resp: web.StreamResponse = web.Response(status=303, headers={**NO_STORE, "Location": landing})
            timeline_page.land(resp, session, max_age, secure)
        elif nxt.startswith("/oauth/authorize?"):
            resp = web.Response(status=303, headers={**NO_STORE, "Location": nxt})
        else:
            resp = _page("Signed in", f"<p>Signed in as <b>{html.escape(name)}</b>. Go back to the authorization page "
                                      "and reload it.</p>")
        resp.set_cookie(SESSION_COOKIE, session, max_age=max_age, path="/oauth", httponly=True, samesite="Lax",
                        secure=secure)
        return resp


OAUTH = web.AppKey("oauth", OAuthWeb)


def add_routes(app: web.Application, oauth: OAuthService, auth: AuthService, public_url: str | None,
               registration: ClientRegistration | None = None) -> None:
    """Register the discovery, registration, approval and token routes."""
    ep = OAuthWeb(oauth, auth, public_url, registration)
    app[OAUTH] = ep
    for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
        app.router.add_get(path, ep.protected_resource)
        app.router.add_route("OPTIONS", path, ep.preflight)
    app.router.add_get("/.well-known/oauth-authorization-server", ep.authorization_server)
    app.router.add_route("OPTIONS", "/.well-known/oauth-authorization-server", ep.preflight)
    for path, handler in (("/oauth/register", ep.register), ("/oauth/token", ep.token), ("/oauth/revoke", ep.revoke)):
        app.router.add_post(path, handler)
        app.router.add_route("OPTIONS", path, ep.preflight)
    app.router.add_get("/oauth/authorize", ep.authorize)
    app.router.add_post("/oauth/authorize", ep.authorize)
    app.router.add_get("/oauth/login", ep.login_page)
    app.router.add_post("/oauth/login", ep.login)


def challenge(request: web.Request, description: str | None) -> str:
    """Return the `WWW-Authenticate` value for a 401 from `/mcp`, pointing at the resource metadata."""
    ep = request.app.get(OAUTH)
    if ep is None:
        return f'Bearer error="invalid_token", error_description="{(description or "").replace(chr(34), chr(39))}"'
    return ep.challenge(request, description)


def _client_credentials(request: web.Request, form: Any) -> tuple[str | None, str | None]:
    header = request.headers.get("Authorization", "")
    if header[:6].lower() == "basic ":
        try:
            client_id, _, secret = base64.b64decode(header[6:].strip(), validate=True).decode().partition(":")
        except ValueError as e:
            raise OAuthError("invalid_client", "malformed Basic credentials", 401) from e
        return unquote_plus(client_id), unquote_plus(secret)
    return _opt(form.get("client_id")), _opt(form.get("client_secret"))


def _opt(value: Any) -> str | None:
    return str(value) if value not in (None, "") else None


def _csrf(session: str) -> str:
    return hashlib.sha256(f"csrf:{session}".encode()).hexdigest()


def _json(data: Any, *, status: int = 200, cache: bool = False) -> web.Response:
    headers = {**CORS, **({"Cache-Control": "public, max-age=3600"} if cache else NO_STORE)}
    return web.json_response(data, status=status, headers=headers)


def _oauth_error(e: OAuthError, *, basic: bool = False) -> web.Response:
    headers = {**CORS, **NO_STORE, **({"WWW-Authenticate": 'Basic realm="amux"'} if basic and e.status == 401 else {})}
    if isinstance(e, RegistrationLimited):
        headers["Retry-After"] = retry_after(e.retry_after_s)
    return web.json_response({"error": e.error, "error_description": e.description}, status=e.status, headers=headers)


def _redirect_to(uri: str, params: dict[str, str | None]) -> web.Response:
    parts = urlsplit(uri)
    query = parse_qsl(parts.query, keep_blank_values=True) + [(k, v) for k, v in params.items() if v is not None]
    return web.Response(status=302,
                        headers={**NO_STORE, "Location": urlunsplit(parts._replace(query=urlencode(query)))})


def _page(title: str, body: str, *, status: int = 200) -> web.Response:
    e = html.escape
    doc = (f'<!doctype html><html><head><meta charset="utf-8"><meta name="viewport" content="width=device-width">'
           f"<title>{e(title)}</title><style>body{{font:15px system-ui,sans-serif;max-width:34rem;margin:3rem auto;"
           "padding:0 1rem}label{display:block;margin:.5rem 0}input[type=password]{width:100%}.err{color:#b00}"
           f"button{{padding:.4rem 1rem}}fieldset{{border:1px solid "
           f"#ccc}}</style></head><body><h1>{e(title)}</h1>{body}"
           "</body></html>")
    return web.Response(text=doc, content_type="text/html", status=status, headers=PAGE_HEADERS)
