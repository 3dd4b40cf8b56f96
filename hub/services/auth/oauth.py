"""The hub as its own OAuth 2.1 authorization server for hosted MCP clients.

The MCP authorization spec (2025-06-18 / 2025-11-25): dynamic client registration (RFC 7591), the
authorization code grant with PKCE S256 only (RFC 7636), rotating refresh tokens, and access tokens
the `/mcp` door resolves to a `Caller` with the granted scopes. HTTP lives in `hub/web/oauth.py`.

Rules: every secret (client secret, code, token, login link, browser session) is random, shown
once and stored as its SHA-256; durations read the injected clock; all state is in the database,
so any replica answers any step. A code is single-use: replaying one revokes what it issued. A
refresh token is single-use: presenting a rotated one revokes its whole family (the grant). A grant approved
with an amux token dies with that token: revoking it revokes the grant, and verification checks it too.
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import re
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Mapping
from urllib.parse import quote, urlsplit

from mcp.shared.auth import OAuthClientMetadata
from pydantic import ValidationError

from ...clock import Clock, utc
from ...domain.timeline import safe_next
from ...errors import Invalid, Unauthorized
from ...ids import new_id
from ...store.db import Connection, Database
from ...store.tokens import SqlOAuthStore
from .service import Caller, hash_secret

SCOPES = ("tasks", "schedules", "leases")
SCOPE_TEXT = {
    "tasks": "submit and follow tasks and agent instances; list profiles",
    "schedules": "create, change and delete schedules",
    "leases": "claim machines (rift tasks and boxes) and run commands in them",
}
ACCESS_PREFIX = "amuxat_"
REFRESH_PREFIX = "amuxrt_"
AUTH_METHODS = ("client_secret_basic", "client_secret_post", "none")
GRANT_TYPES = ("authorization_code", "refresh_token")
BAD_SCHEMES = {"javascript", "data", "file", "vbscript", "about", "blob"}
LOOPBACK = {"localhost", "127.0.0.1", "::1", "[::1]"}
VERIFIER = re.compile(r"[A-Za-z0-9._~-]{43,128}")
CHALLENGE = re.compile(r"[A-Za-z0-9_-]{43}")
RESTART = "remove the hub from your MCP client and add it again to sign in anew"


class OAuthError(Exception):
    """An OAuth protocol error (RFC 6749 §5.2): a code, a description that names the fix, a status."""

    def __init__(self, error: str, description: str, status: int = 400) -> None:
        super().__init__(description)
        self.error, self.description, self.status = error, description, status


class PageError(Exception):
    """An authorization request that must not redirect (unknown client, unregistered redirect_uri)."""


class RedirectError(Exception):
    """An authorization request error reported back to the client's redirect_uri."""

    def __init__(self, redirect_uri: str, error: str, description: str, state: str | None) -> None:
        super().__init__(description)
        self.redirect_uri, self.error, self.description, self.state = redirect_uri, error, description, state


@dataclass(frozen=True, kw_only=True)
class Client:
    """A registered OAuth client."""

    id: str
    name: str
    redirect_uris: tuple[str, ...]
    scopes: tuple[str, ...]
    auth_method: str
    secret_hash: str | None


@dataclass(frozen=True, kw_only=True)
class AuthorizeRequest:
    """A validated authorization request, waiting for the user's decision."""

    client: Client
    redirect_uri: str
    redirect_explicit: bool
    state: str | None
    code_challenge: str
    scopes: tuple[str, ...]
    resource: str | None


def pkce_s256(verifier: str) -> str:
    """Return the S256 code challenge of a verifier."""
    return base64.urlsafe_b64encode(hashlib.sha256(verifier.encode()).digest()).decode().rstrip("=")


def known_scopes(scope: str | None) -> list[str]:
    """Return the scopes of a space-separated list this hub knows, in canonical order (others are ignored)."""
    asked = set((scope or "").split())
    return [s for s in SCOPES if s in asked]


def check_redirect_uri(uri: str) -> None:
    """Refuse a redirect URI no client should register (RFC 8252 §7, OAuth 2.1 §2.3.1)."""
    parts = urlsplit(uri)
    scheme = parts.scheme.lower()
    if len(uri) > 2000 or not scheme or parts.fragment or scheme in BAD_SCHEMES:
        raise OAuthError("invalid_redirect_uri",
                         f"redirect URI {uri[:200]!r} is not an absolute URI without a fragment")
    if scheme == "http" and (parts.hostname or "") not in LOOPBACK:
        raise OAuthError("invalid_redirect_uri",
                         f"redirect URI {uri[:200]!r} uses plain http off the loopback interface; use https")
    if scheme in ("http", "https") and not parts.hostname:
        raise OAuthError("invalid_redirect_uri", f"redirect URI {uri[:200]!r} has no host")


def same_resource(given: str, resources: tuple[str, ...]) -> bool:
    """Whether an RFC 8707 resource indicator names this hub's MCP endpoint (or the hub itself)."""
    return given.rstrip("/") in {r.rstrip("/") for r in resources}


class OAuthService:
    """Register clients, issue codes and tokens, verify access tokens, sign users in with login links."""

    def __init__(self, db: Database, clock: Clock, *, access_ttl_s: float = 3600,
                 refresh_ttl_s: float = 30 * 86400, code_ttl_s: float = 600, login_ttl_s: float = 600,
                 session_ttl_s: float = 3600, cache_s: float = 5.0) -> None:
        self.db, self.clock = db, clock
        self.store = SqlOAuthStore(db)
        self.access_ttl = timedelta(seconds=access_ttl_s)
        self.refresh_ttl = timedelta(seconds=refresh_ttl_s)
        self.code_ttl = timedelta(seconds=code_ttl_s)
        self.login_ttl = timedelta(seconds=login_ttl_s)
        self.session_ttl = timedelta(seconds=session_ttl_s)
        self.cache_s = cache_s
        self._verified: dict[str, tuple[float, Any, Caller]] = {}  # hash -> (monotonic deadline, expires_at, caller)

    # ------------------------------------------------------------------ clients (RFC 7591)

    async def register(self, body: bytes) -> dict[str, Any]:
        """Register a client from its JSON metadata; return the client information (the secret shown once)."""
        try:
            raw = json.loads(body or b"null")
            meta = OAuthClientMetadata.model_validate(raw)
        except (ValueError, ValidationError) as e:
            raise OAuthError("invalid_client_metadata", f"client metadata is not valid: {str(e)[:300]}") from e
        uris = [str(u) for u in raw.get("redirect_uris") or []]
        if not uris or len(uris) > 20:
            raise OAuthError("invalid_redirect_uri", "register 1 to 20 redirect_uris")
        for uri in uris:
            check_redirect_uri(uri)
        method = meta.token_endpoint_auth_method or "client_secret_basic"  # RFC 7591 §2 default
        if method not in AUTH_METHODS:
            raise OAuthError("invalid_client_metadata",
                             f"token_endpoint_auth_method must be one of {', '.join(AUTH_METHODS)}")
        grants = list(meta.grant_types)
        if "authorization_code" not in grants or any(g not in GRANT_TYPES for g in grants):
            raise OAuthError("invalid_client_metadata",
                             "grant_types must include authorization_code and may add refresh_token only")
        if meta.response_types and "code" not in meta.response_types:
            raise OAuthError("invalid_client_metadata", "response_types must be [\"code\"]")
        scopes = known_scopes(meta.scope) or list(SCOPES)
        name = "".join(ch for ch in (meta.client_name or "").strip() if ch.isprintable())[:120]
        now = self.clock.now()
        client_id = new_id("oc")
        secret = secrets.token_urlsafe(32) if method != "none" else None
        info = {**meta.model_dump(mode="json", exclude_none=True), "redirect_uris": uris, "scope": " ".join(scopes),
                "grant_types": grants, "response_types": ["code"], "token_endpoint_auth_method": method,
                "client_id": client_id, "client_id_issued_at": int(now.timestamp())}
        async with self.db.write() as conn:
            await self.store.add_client(conn, client_id=client_id, secret_hash=hash_secret(secret) if secret else None,
                                        name=name or client_id, redirect_uris=uris, scope=" ".join(scopes),
                                        auth_method=method, info=info, now=now)
        if secret:
            info |= {"client_secret": secret, "client_secret_expires_at": 0}
        return info

    async def client(self, client_id: str) -> Client | None:
        """Return a registered client, or None."""
        if not client_id or len(client_id) > 64:
            return None
        async with self.db.read() as conn:
            row = await self.store.client(conn, client_id)
        if row is None:
            return None
        return Client(id=row.id, name=row.name, redirect_uris=tuple(row.redirect_uris), scopes=tuple(row.scope.split()),
                      auth_method=row.auth_method, secret_hash=row.secret_hash)

    async def authenticate_client(self, client_id: str | None, secret: str | None) -> Client:
        """Return the client a token request names, checking its secret when it has one (RFC 6749 §2.3)."""
        client = await self.client(client_id or "")
        if client is None:
            raise OAuthError("invalid_client", f"client {str(client_id)[:64]!r} is not registered: {RESTART}", 401)
        if client.secret_hash and not (secret and hmac.compare_digest(client.secret_hash, hash_secret(secret))):
            raise OAuthError("invalid_client",
                             "client authentication failed: send the client_secret issued at registration", 401)
        return client

    # ------------------------------------------------------------------ authorization requests

    async def check_authorize(self, q: Mapping[str, str], resources: tuple[str, ...]) -> AuthorizeRequest:
        """Validate an authorization request; PageError when no redirect is safe, RedirectError otherwise."""
        client = await self.client(q.get("client_id", ""))
        if client is None:
            raise PageError("This application is not registered with the hub (unknown client_id). "
                            f"In the application, {RESTART}.")
        redirect = q.get("redirect_uri")
        explicit = redirect is not None
        if redirect is None:
            if len(client.redirect_uris) != 1:
                raise PageError("The request names no redirect_uri and the application registered several; "
                                "it must name one.")
            redirect = client.redirect_uris[0]
        elif redirect not in client.redirect_uris:
            raise PageError("The redirect_uri of this request was not registered by the application, so the hub "
                            f"will not send a code there. In the application, {RESTART}.")
        state = q.get("state")

        def fail(error: str, description: str) -> RedirectError:
            return RedirectError(redirect, error, description, state)

        if q.get("response_type") != "code":
            raise fail("unsupported_response_type", "response_type must be code")
        challenge = q.get("code_challenge", "")
        if not challenge:
            raise fail("invalid_request", "code_challenge is required: PKCE with S256")
        if q.get("code_challenge_method") != "S256":
            raise fail("invalid_request", "code_challenge_method must be S256")
        if not CHALLENGE.fullmatch(challenge):
            raise fail("invalid_request",
                       "code_challenge must be the base64url SHA-256 of the code verifier (43 characters)")
        scopes = ([s for s in known_scopes(q.get("scope")) if s in client.scopes] if q.get("scope")
                  else list(client.scopes))
        if not scopes:
            raise fail("invalid_scope",
                       f"request at least one of the scopes this client registered: {' '.join(client.scopes)}")
        resource = q.get("resource") or None
        if resource and not same_resource(resource, resources):
            raise fail("invalid_target", f"resource must be this hub's MCP endpoint {resources[0]}")
        return AuthorizeRequest(client=client, redirect_uri=redirect, redirect_explicit=explicit, state=state,
                                code_challenge=challenge, scopes=tuple(scopes), resource=resource)

    async def approve(self, req: AuthorizeRequest, principal_id: str, scopes: list[str], *,
                      approved_by: str | None = None) -> str:
        """Record the user's approval and return a single-use authorization code (short-lived).

        `approved_by`: the amux token that approved (None for a browser sign-in); its grant dies with that token.
        """
        code = secrets.token_urlsafe(32)
        now = self.clock.now()
        async with self.db.write() as conn:
            await self.store.add_code(conn, code_hash=hash_secret(code), client_id=req.client.id,
                                      principal_id=principal_id, redirect_uri=req.redirect_uri,
                                      redirect_explicit=req.redirect_explicit, code_challenge=req.code_challenge,
                                      scope=" ".join(s for s in SCOPES if s in scopes), resource=req.resource,
                                      expires_at=now + self.code_ttl, now=now, approved_by=approved_by)
        return code

    # ------------------------------------------------------------------ the token endpoint

    async def exchange_code(self, client: Client, code: str, verifier: str, redirect_uri: str | None,
                            resource: str | None, resources: tuple[str, ...]) -> dict[str, Any]:
        """Trade a code for tokens: once, before it expires, with the PKCE verifier and the same redirect_uri."""
        if not code or not verifier:
            raise OAuthError("invalid_request", "code and code_verifier are required")
        if not VERIFIER.fullmatch(verifier):
            raise OAuthError("invalid_grant", "code_verifier must be 43–128 unreserved characters")
        if resource and not same_resource(resource, resources):
            raise OAuthError("invalid_target", f"resource must be this hub's MCP endpoint {resources[0]}")
        now = self.clock.now()
        failure, tokens = None, None
        async with self.db.write() as conn:
            row = await self.store.code_to_exchange(conn, hash_secret(code))
            if row is None or row.client_id != client.id:
                failure = "authorization code is unknown: start the authorization again"
            elif row.used_at is not None:
                failure = ("authorization code was already used; what it issued is now revoked: "
                           "start the authorization again")
                if row.grant_id:
                    await self._revoke_grant(conn, row.grant_id, now, "authorization code replayed")
            else:
                # Any attempt spends the code, so a wrong verifier cannot be retried against it.
                await self.store.spend_code(conn, row.code_hash, now)
                if utc(row.expires_at) <= now:
                    failure = "authorization code has expired (codes last 10 minutes): start the authorization again"
                elif (row.redirect_explicit or redirect_uri is not None) and redirect_uri != row.redirect_uri:
                    failure = "redirect_uri differs from the one of the authorization request"
                elif not hmac.compare_digest(pkce_s256(verifier), row.code_challenge):
                    failure = "code_verifier does not match the code_challenge (PKCE)"
                else:
                    grant_id = new_id("og")
                    await self.store.grant_code(conn, row, grant_id, now)
                    tokens = await self._mint(conn, grant_id, row.scope, now)
        if failure or tokens is None:
            raise OAuthError("invalid_grant", failure or "authorization code is unknown: start the authorization again")
        return tokens

    async def refresh(self, client: Client, refresh_token: str, scope: str | None) -> dict[str, Any]:
        """Rotate a refresh token: the new pair replaces it; presenting it again revokes the whole grant."""
        if not refresh_token:
            raise OAuthError("invalid_request", "refresh_token is required")
        now = self.clock.now()
        failure, tokens = None, None
        async with self.db.write() as conn:
            row = await self.store.refresh_to_rotate(conn, hash_secret(refresh_token))
            if row is None or row.client_id != client.id:
                failure = ("invalid_grant", "refresh token is unknown: sign in again")
            elif row.revoked_at is not None or row.approver_revoked_at is not None:
                failure = ("invalid_grant", "this sign-in was revoked: sign in again")
            elif row.rotated_at is not None:
                await self._revoke_grant(conn, row.grant_id, now, "refresh token reused")
                failure = ("invalid_grant", "refresh token was already used, so this sign-in is revoked: sign in again")
            elif utc(row.expires_at) <= now:
                failure = ("invalid_grant", "refresh token has expired: sign in again")
            else:
                wanted = known_scopes(scope) if scope else row.scope.split()
                if not wanted or any(s not in row.grant_scope.split() for s in wanted):
                    failure = ("invalid_scope", f"scope may only narrow the granted scopes: {row.grant_scope}")
                else:
                    await self.store.rotate(conn, row.token_hash, now)
                    tokens = await self._mint(conn, row.grant_id, " ".join(wanted), now)
        if failure or tokens is None:
            raise OAuthError(*(failure or ("invalid_grant", "refresh token is unknown: sign in again")))
        return tokens

    async def revoke(self, client: Client, token: str) -> None:
        """Revoke the grant a token of this client belongs to (RFC 7009: unknown tokens are fine)."""
        now = self.clock.now()
        async with self.db.write() as conn:
            grant_id = await self.store.grant_of(conn, hash_secret(token or ""), client.id)
            if grant_id is not None:
                await self._revoke_grant(conn, grant_id, now, "revoked by the client")

    async def _mint(self, conn: Connection, grant_id: str, scope: str, now: datetime) -> dict[str, Any]:
        access, refresh = ACCESS_PREFIX + secrets.token_urlsafe(32), REFRESH_PREFIX + secrets.token_urlsafe(32)
        await self.store.add_token_pair(conn, grant_id, scope, access_hash=hash_secret(access),
                                        access_expires_at=now + self.access_ttl, refresh_hash=hash_secret(refresh),
                                        refresh_expires_at=now + self.refresh_ttl, now=now)
        return {"access_token": access, "token_type": "Bearer", "expires_in": int(self.access_ttl.total_seconds()),
                "refresh_token": refresh, "scope": scope}

    async def _revoke_grant(self, conn: Connection, grant_id: str, now: datetime, reason: str) -> None:
        await self.store.revoke_grant(conn, grant_id, now, reason)
        self.forget_grants([grant_id])

    def forget_grants(self, grant_ids: list[str]) -> None:
        """Drop these grants' access tokens from this replica's verification cache (they were revoked here)."""
        for digest, (_, _, caller) in list(self._verified.items()):
            if caller.token_id in grant_ids:
                self._verified.pop(digest, None)

    # ------------------------------------------------------------------ the resource server's side

    def is_access_token(self, token: str) -> bool:
        """Return whether `token` has the shape of an access token this hub issues."""
        return token.startswith(ACCESS_PREFIX) and len(token) <= 200

    async def verify_access_token(self, token: str) -> Caller:
        """Return the granting principal's Caller, labelled `mcp:<client name>`, with the token's scopes.

        Verified tokens are remembered for `cache_s` seconds (never past their expiry), so a revocation
        on another replica reaches this one within that time.
        """
        digest = hash_secret(token)
        now = self.clock.now()
        hit = self._verified.get(digest)
        if hit is not None and hit[0] > time.monotonic() and hit[1] > now:
            return hit[2]
        async with self.db.read() as conn:
            row = await self.store.access_token(conn, digest)
        if row is None or row.revoked_at is not None or row.approver_revoked_at is not None:
            raise Unauthorized(f"invalid or revoked OAuth access token: {RESTART}")
        expires = utc(row.expires_at)
        if expires <= now:
            raise Unauthorized("OAuth access token has expired: refresh it at the hub's token endpoint")
        caller = Caller(row.principal_id, row.name, row.id, f"mcp:{row.client_name}", False,
                        scopes=frozenset(row.scope.split()))
        if len(self._verified) > 10_000:
            self._verified.clear()
        self._verified[digest] = (time.monotonic() + self.cache_s, expires, caller)
        return caller

    # ------------------------------------------------------------------ signing in on the approval page

    async def issue_login_link(self, principal_id: str, base_url: str, next_path: str | None = None) -> str:
        """Return a one-time sign-in link for the approval page (10 minutes); the Feishu bot sends it to a bound
        user. With `next_path` (only a timeline page of this hub: `safe_next`), signing in lands there."""
        if next_path is not None and safe_next(next_path) is None:
            raise Invalid(f"a sign-in link can land only on a timeline page (/timeline/tasks/ID or "
                          f"/timeline/turns/ID), not {next_path[:100]!r}")
        code = secrets.token_urlsafe(24)
        now = self.clock.now()
        async with self.db.write() as conn:
            await self.store.add_login(conn, hash_secret(code), "link", principal_id, expires_at=now + self.login_ttl,
                                       now=now)
        link = f"{base_url.rstrip('/')}/oauth/login?code={code}"
        return f"{link}&next={quote(next_path, safe='/')}" if next_path else link

    async def redeem_login(self, code: str) -> tuple[str, str]:
        """Spend a login link; return (browser session secret, principal name)."""
        now = self.clock.now()
        session = secrets.token_urlsafe(32)
        async with self.db.write() as conn:
            row = await self.store.link_to_redeem(conn, hash_secret(code or ""))
            if row is not None and row.used_at is None and utc(row.expires_at) > now:
                await self.store.spend_login(conn, row.secret_hash, now)
                await self.store.add_login(conn, hash_secret(session), "session", row.principal_id,
                                           expires_at=now + self.session_ttl, now=now)
                return session, row.name
        raise Unauthorized("this sign-in link is unknown, already used or expired: "
                           "ask the amux bot for a new one (`/amux login`)")

    async def session_principal(self, session: str | None) -> tuple[str, str] | None:
        """Return (principal id, name) of a live browser session, or None."""
        if not session or len(session) > 100:
            return None
        async with self.db.read() as conn:
            row = await self.store.session(conn, hash_secret(session))
        if row is None or utc(row.expires_at) <= self.clock.now():
            return None
        return row.principal_id, row.name
