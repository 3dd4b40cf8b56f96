"""OAuth for hosted MCP clients, over real HTTP: discovery, registration, approval, PKCE, tokens, scopes."""
from __future__ import annotations

import base64
import hashlib
import re
import secrets
from contextlib import asynccontextmanager
from html import unescape
from urllib.parse import parse_qs, urlencode, urlsplit

import httpx2
from mcp import Client
from mcp.client.auth import OAuthClientProvider
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata, OAuthToken
from mcp.types import Implementation

REDIRECT = "http://127.0.0.1:33418/callback"


def pkce() -> tuple[str, str]:
    verifier = secrets.token_urlsafe(48)
    return verifier, base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")


async def register(http: httpx2.AsyncClient, url: str, **meta) -> dict:
    body = {"client_name": "Hosted Agent", "redirect_uris": [REDIRECT], **meta}
    resp = await http.post(f"{url}/oauth/register", json=body)
    assert resp.status_code == 201, resp.text
    return resp.json()


def hidden_fields(page: str) -> dict[str, str]:
    return {unescape(n): unescape(v)
            for n, v in re.findall(r'<input type="hidden" name="([^"]+)" value="([^"]*)">', page)}


async def approve(http: httpx2.AsyncClient, authorize_url: str, token: str | None, grant: list[str] | None = None,
                  decision: str = "approve") -> httpx2.Response:
    """Open the approval page as a browser would and submit it; return the hub's answer (a redirect when it worked)."""
    page = await http.get(authorize_url)
    assert page.status_code == 200, page.text
    fields = hidden_fields(page.text)
    grants = grant or re.findall(r'name="grant" value="(\w+)"', page.text)
    form = list(fields.items()) + [("decision", decision)] + [("grant", s) for s in grants]
    if token:
        form.append(("token", token))
    base = authorize_url.split("/oauth/authorize")[0]
    return await http.post(f"{base}/oauth/authorize", content=urlencode(form),
                           headers={"Content-Type": "application/x-www-form-urlencoded"})


def redirected(resp: httpx2.Response) -> dict[str, str]:
    assert resp.status_code == 302, resp.text
    location = resp.headers["location"]
    assert location.startswith(REDIRECT)
    return {k: v[0] for k, v in parse_qs(urlsplit(location).query).items()}


def authorize_url(url: str, client: dict, challenge: str, **extra) -> str:
    q = {"response_type": "code", "client_id": client["client_id"], "redirect_uri": REDIRECT, "state": "st-1",
         "code_challenge": challenge, "code_challenge_method": "S256", "scope": "tasks schedules leases",
         "resource": f"{url}/mcp", **extra}
    return f"{url}/oauth/authorize?{urlencode({k: v for k, v in q.items() if v is not None})}"


async def token_request(http: httpx2.AsyncClient, url: str, client: dict, **form) -> httpx2.Response:
    auth = (client["client_id"], client["client_secret"]) if client.get("client_secret") else None
    data = form if auth else {"client_id": client["client_id"], **form}
    return await http.post(f"{url}/oauth/token", data=data, auth=auth)


async def signed_in(http: httpx2.AsyncClient, url: str, amux_token: str, grant: list[str] | None = None,
                    **meta) -> tuple[dict, dict]:
    """Register, approve with an amux token, exchange the code: return (client, token response)."""
    client = await register(http, url, **meta)
    verifier, challenge = pkce()
    params = redirected(await approve(http, authorize_url(url, client, challenge), amux_token, grant))
    assert params["state"] == "st-1" and params["iss"] == url
    resp = await token_request(http, url, client, grant_type="authorization_code", code=params["code"],
                               redirect_uri=REDIRECT, code_verifier=verifier, resource=f"{url}/mcp")
    assert resp.status_code == 200, resp.text
    assert resp.headers["cache-control"] == "no-store"
    return client, resp.json()


@asynccontextmanager
async def bearer_client(url: str, access_token: str, name: str = "hosted", mode: str = "auto"):
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {access_token}"}, timeout=60) as http:
        async with Client(streamable_http_client(f"{url}/mcp", http_client=http),
                          client_info=Implementation(name=name, version="1.0"), mode=mode) as client:
            yield client


async def mcp_status(url: str, access_token: str) -> httpx2.Response:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    async with httpx2.AsyncClient() as http:
        return await http.post(f"{url}/mcp", json=body, headers={"Authorization": f"Bearer {access_token}",
                                                                 "Accept": "application/json, text/event-stream"})


class MemoryStorage:
    def __init__(self) -> None:
        self.tokens: OAuthToken | None = None
        self.client: OAuthClientInformationFull | None = None

    async def get_tokens(self):
        return self.tokens

    async def set_tokens(self, tokens):
        self.tokens = tokens

    async def get_client_info(self):
        return self.client

    async def set_client_info(self, info):
        self.client = info


async def test_the_official_mcp_client_discovers_registers_signs_in_and_calls_tools_then_refresh_rotates(any_hub):
    """The SDK's OAuth provider does discovery from the 401, registration, PKCE and the code exchange by itself."""
    url, amux_token = any_hub.url, await any_hub.token("alice")
    storage, result = MemoryStorage(), {}

    async with httpx2.AsyncClient(follow_redirects=False) as browser:
        async def redirect_handler(authorization_url: str) -> None:
            params = redirected(await approve(browser, authorization_url, amux_token))
            result.update(params)

        async def callback_handler() -> AuthorizationCodeResult:
            return AuthorizationCodeResult(code=result["code"], state=result["state"], iss=result.get("iss"))

        provider = OAuthClientProvider(
            f"{url}/mcp", OAuthClientMetadata(client_name="Hosted Agent", redirect_uris=[REDIRECT]), storage,
            redirect_handler=redirect_handler, callback_handler=callback_handler)
        async with httpx2.AsyncClient(auth=provider, timeout=60) as http:
            async with Client(streamable_http_client(f"{url}/mcp", http_client=http),
                              client_info=Implementation(name="hosted", version="1.0")) as client:
                res = await client.call_tool("profile_list", {})
                assert not res.is_error, res.content
                lease = await client.call_tool("rift_task_new", {"name": "oauth-demo"})
                assert not lease.is_error, lease.content

        assert storage.tokens.scope == "tasks schedules leases" and storage.tokens.expires_in == 3600
        assert storage.tokens.access_token.startswith("amuxat_")
        first_refresh = storage.tokens.refresh_token
        client = storage.client.model_dump(mode="json", exclude_none=True)

        # Rotation: a refresh returns a new pair; the old access token keeps working until it expires.
        rotated = await token_request(browser, url, client, grant_type="refresh_token", refresh_token=first_refresh)
        assert rotated.status_code == 200, rotated.text
        new = rotated.json()
        assert new["refresh_token"] != first_refresh and new["access_token"] != storage.tokens.access_token
        assert (await mcp_status(url, new["access_token"])).status_code == 200

        # Reuse of the rotated refresh token revokes the whole family: new tokens included.
        replay = await token_request(browser, url, client, grant_type="refresh_token", refresh_token=first_refresh)
        assert replay.status_code == 400 and replay.json()["error"] == "invalid_grant"
        assert (await mcp_status(url, new["access_token"])).status_code == 401
        again = await token_request(browser, url, client, grant_type="refresh_token",
                                    refresh_token=new["refresh_token"])
        assert again.status_code == 400 and again.json()["error"] == "invalid_grant"

    async with any_hub.hub.db.read() as conn:
        import sqlalchemy as sa

        from hub.store.tables import oauth_tokens
        stored = set((await conn.execute(sa.select(oauth_tokens.c.token_hash))).scalars())
    assert first_refresh not in stored and new["access_token"] not in stored  # hashes only
    assert hashlib.sha256(first_refresh.encode()).hexdigest() in stored


async def test_401_from_mcp_points_at_the_metadata_which_describe_the_hub_as_its_own_authorization_server(hub):
    async with httpx2.AsyncClient() as http:
        body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
        bare = await http.post(f"{hub.url}/mcp", json=body, headers={"Accept": "application/json, text/event-stream"})
        wrong = await http.post(f"{hub.url}/mcp", json=body, headers={"Authorization": "Bearer amuxat_nope"})
        assert bare.status_code == wrong.status_code == 401
        challenge = bare.headers["www-authenticate"]
        assert challenge.startswith(f'Bearer resource_metadata="{hub.url}/.well-known/oauth-protected-resource"')
        assert "error=" not in challenge  # no credentials, no error code (RFC 6750 §3.1)
        assert 'error="invalid_token"' in wrong.headers["www-authenticate"]

        for path in ("/.well-known/oauth-protected-resource", "/.well-known/oauth-protected-resource/mcp"):
            prm = (await http.get(hub.url + path)).json()
            assert prm["resource"] == f"{hub.url}/mcp" and prm["authorization_servers"] == [hub.url]
            assert prm["scopes_supported"] == ["tasks", "schedules", "leases"]
        asm = await http.get(f"{hub.url}/.well-known/oauth-authorization-server")
        meta = asm.json()
    assert asm.headers["access-control-allow-origin"] == "*"
    assert meta["issuer"] == hub.url
    assert meta["authorization_endpoint"] == f"{hub.url}/oauth/authorize"
    assert meta["token_endpoint"] == f"{hub.url}/oauth/token"
    assert meta["registration_endpoint"] == f"{hub.url}/oauth/register"
    assert meta["code_challenge_methods_supported"] == ["S256"]
    assert meta["grant_types_supported"] == ["authorization_code", "refresh_token"]
    assert "none" in meta["token_endpoint_auth_methods_supported"]


async def test_codes_are_single_use_and_short_lived_and_a_replay_revokes_what_the_code_issued(any_hub):
    url, amux_token = any_hub.url, await any_hub.token("alice")
    async with httpx2.AsyncClient() as http:
        client = await register(http, url)
        verifier, challenge = pkce()
        code = redirected(await approve(http, authorize_url(url, client, challenge), amux_token))["code"]
        ok = await token_request(http, url, client, grant_type="authorization_code", code=code, redirect_uri=REDIRECT,
                                 code_verifier=verifier)
        assert ok.status_code == 200
        replay = await token_request(http, url, client, grant_type="authorization_code", code=code,
                                     redirect_uri=REDIRECT, code_verifier=verifier)
        assert replay.status_code == 400 and replay.json()["error"] == "invalid_grant"
        assert "already used" in replay.json()["error_description"]
        assert (await mcp_status(url, ok.json()["access_token"])).status_code == 401

        verifier, challenge = pkce()
        code = redirected(await approve(http, authorize_url(url, client, challenge), amux_token))["code"]
        any_hub.clock.advance(601)
        late = await token_request(http, url, client, grant_type="authorization_code", code=code,
                                   redirect_uri=REDIRECT, code_verifier=verifier)
    assert late.status_code == 400 and late.json()["error"] == "invalid_grant"
    assert "expired" in late.json()["error_description"]


async def test_access_tokens_expire_after_an_hour_and_a_refresh_brings_a_working_one(any_hub):
    url, amux_token = any_hub.url, await any_hub.token("alice")
    async with httpx2.AsyncClient() as http:
        client, tokens = await signed_in(http, url, amux_token)
        assert (await mcp_status(url, tokens["access_token"])).status_code == 200
        any_hub.clock.advance(3601)
        expired = await mcp_status(url, tokens["access_token"])
        assert expired.status_code == 401 and 'error="invalid_token"' in expired.headers["www-authenticate"]
        fresh = await token_request(http, url, client, grant_type="refresh_token",
                                    refresh_token=tokens["refresh_token"])
        assert fresh.status_code == 200, fresh.text
    assert (await mcp_status(url, fresh.json()["access_token"])).status_code == 200


async def test_a_wrong_pkce_verifier_or_redirect_uri_gets_invalid_grant_and_spends_the_code(hub):
    amux_token = await hub.token("alice")
    async with httpx2.AsyncClient() as http:
        client = await register(http, hub.url)
        verifier, challenge = pkce()
        code = redirected(await approve(http, authorize_url(hub.url, client, challenge), amux_token))["code"]
        wrong = await token_request(http, hub.url, client, grant_type="authorization_code", code=code,
                                    redirect_uri=REDIRECT, code_verifier=pkce()[0])
        assert wrong.status_code == 400 and wrong.json()["error"] == "invalid_grant"
        assert "PKCE" in wrong.json()["error_description"]
        right = await token_request(http, hub.url, client, grant_type="authorization_code", code=code,
                                    redirect_uri=REDIRECT, code_verifier=verifier)
        assert right.status_code == 400  # spent by the failed attempt

        verifier, challenge = pkce()
        code = redirected(await approve(http, authorize_url(hub.url, client, challenge), amux_token))["code"]
        moved = await token_request(http, hub.url, client, grant_type="authorization_code", code=code,
                                    redirect_uri="http://127.0.0.1:1/elsewhere", code_verifier=verifier)
        assert moved.status_code == 400 and moved.json()["error"] == "invalid_grant"

        stranger = {"client_id": client["client_id"], "client_secret": "not-the-secret"}
        bad_client = await token_request(http, hub.url, stranger, grant_type="authorization_code", code="x",
                                         code_verifier=verifier)
    assert bad_client.status_code == 401 and bad_client.json()["error"] == "invalid_client"


async def test_an_unregistered_redirect_uri_or_unknown_client_gets_an_error_page_never_a_redirect(hub):
    async with httpx2.AsyncClient() as http:
        client = await register(http, hub.url)
        _, challenge = pkce()
        for url in (authorize_url(hub.url, client, challenge, redirect_uri="https://evil.example/cb"),
                    authorize_url(hub.url, {"client_id": "oc_unknown"}, challenge)):
            resp = await http.get(url)
            assert resp.status_code == 400 and "location" not in resp.headers
            assert "Cannot authorize" in resp.text
        # Other mistakes go back to the (registered) redirect URI, per RFC 6749 §4.1.2.1.
        no_pkce = redirected(await http.get(authorize_url(hub.url, client, challenge, code_challenge=None)))
        assert no_pkce["error"] == "invalid_request" and no_pkce["state"] == "st-1"
        plain = redirected(await http.get(authorize_url(hub.url, client, challenge, code_challenge_method="plain")))
        assert plain["error"] == "invalid_request"
        denied = redirected(await approve(http, authorize_url(hub.url, client, challenge), None, decision="deny"))
        assert denied["error"] == "access_denied"
        bad_token = await approve(http, authorize_url(hub.url, client, challenge), "amux.nope.nope")
        assert bad_token.status_code == 401 and "amux token create" in unescape(bad_token.text)
        # Registration refuses redirect URIs no client should use.
        for uri in ("http://evil.example/cb", "javascript:alert(1)", "https://x.example/cb#frag"):
            refused = await http.post(f"{hub.url}/oauth/register", json={"redirect_uris": [uri]})
            assert refused.status_code == 400 and refused.json()["error"] in ("invalid_redirect_uri",
                                                                              "invalid_client_metadata")


async def test_scopes_limit_the_tools_of_an_oauth_caller_and_oauth_tokens_open_only_mcp(any_hub):
    url, amux_token = any_hub.url, await any_hub.token("alice")
    async with httpx2.AsyncClient() as http:
        _, tokens = await signed_in(http, url, amux_token, grant=["leases"], token_endpoint_auth_method="none")
        assert tokens["scope"] == "leases"
        rest = await http.get(f"{url}/api/v1/tasks", headers={"Authorization": f"Bearer {tokens['access_token']}"})
        assert rest.status_code == 401
    async with bearer_client(url, tokens["access_token"]) as c:
        refused = await c.call_tool("task_submit", {"prompt": "say hi", "profile": "scripted"})
        assert refused.is_error and "`tasks` scope" in refused.content[0].text
        refused = await c.call_tool("schedule_list", {})
        assert refused.is_error and "`schedules` scope" in refused.content[0].text
        listed = await c.call_tool("rift_task_list", {})
        assert not listed.is_error, listed.content
    async with bearer_client(url, tokens["access_token"], mode="legacy") as c:  # the refusal's wire shape per version
        refused = await c.call_tool("profile_list", {})
        assert refused.is_error and "`tasks` scope" in refused.content[0].text
    # An amux bearer token carries every scope, as before.
    async with bearer_client(url, amux_token) as c:
        assert not (await c.call_tool("schedule_list", {})).is_error


async def test_a_one_time_feishu_login_link_signs_the_browser_in_for_the_approval_page(hub):
    pid = (await hub.hub.auth.authenticate(await hub.token("bob"))).principal_id
    link = await hub.hub.oauth.issue_login_link(pid, hub.url)
    async with httpx2.AsyncClient() as browser:
        client = await register(browser, hub.url)
        verifier, challenge = pkce()
        start = authorize_url(hub.url, client, challenge)
        first = await browser.get(start)
        assert "Signed in as" not in first.text
        code = parse_qs(urlsplit(link).query)["code"][0]
        assert (await browser.get(link)).status_code == 200  # a preview fetching the link does not spend it
        login = await browser.post(f"{hub.url}/oauth/login", data={"code": code})
        assert login.status_code == 303 and login.headers["location"].startswith("/oauth/authorize?")
        params = redirected(await approve(browser, start, None))
        resp = await token_request(browser, hub.url, client, grant_type="authorization_code", code=params["code"],
                                   redirect_uri=REDIRECT, code_verifier=verifier)
        assert resp.status_code == 200
        caller = await hub.hub.oauth.verify_access_token(resp.json()["access_token"])
        assert caller.principal == "bob" and caller.label == "mcp:Hosted Agent"
        again = await browser.post(f"{hub.url}/oauth/login", data={"code": code})
        assert again.status_code == 401
    # A page posted without the session's CSRF value (another site's form) is not an approval.
    async with httpx2.AsyncClient() as other:
        forged = await approve(other, start, None)
        assert forged.status_code == 401
