"""Principals and API tokens: random, shown once, stored as SHA-256, checked in constant time."""
from __future__ import annotations

import builtins
import hashlib
import hmac
import secrets
import time
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Callable, Collection, NamedTuple
from typing import Protocol

from ...clock import Clock, utc
from ...domain.tasks import is_terminal
from ...errors import Forbidden, Invalid, NotFound, Unauthorized
from ...ids import new_id
from ...store.db import Connection, Database, Row
from ...store.tokens import SqlOAuthStore, SqlTokenStore

TOKEN_PREFIX = "amux"
MISSING = (
    "missing bearer token: send `Authorization: Bearer <token>`; "
    "create one with `amux token create --principal NAME`"
)
WRONG = "invalid or revoked token: create a new one with `amux token create --principal NAME`"
LAST_USED_GRANULARITY = timedelta(minutes=1)
KINDS = ("user", "admin", "runner", "run")
RUNNER_ONLY = ("this is a runner token: it only connects `amux runner` to /runner/ws; "
               "use a user token here (`amux token create --principal NAME`)")
RUN_NOT_RUNNER = ("a task run's token cannot register a runtime; start the runner with a runner token "
                  "(`amux token create --principal NAME --runner`)")
RUN_ENDED = "this task run's token ended with its run; a new run gets a new AMUX_TOKEN"
ALL_SCOPES = frozenset({"tasks", "schedules", "leases"})  # OAuth scopes; amux bearer tokens carry all of them


class RunToken(NamedTuple):
    """A run token to mint (`AuthService.mint_runs`): whose, for which run, its label, and whether it is the first
    dispatch of the run's first attempt (no earlier token to revoke)."""

    principal_id: str
    task_id: str
    label: str
    first: bool = False


@dataclass(frozen=True)
class Caller:
    """Who is calling: the token's principal, label, admin flag and token kind."""

    principal_id: str
    principal: str
    token_id: str
    label: str | None
    admin: bool
    kind: str = "user"           # user | admin | runner | run
    task_id: str | None = None   # a run token's task run
    shared: bool = False         # a runner token made by an admin: the runtimes it registers are shared
    scopes: frozenset[str] = ALL_SCOPES  # narrower only for OAuth-issued access tokens


def hash_secret(secret: str) -> str:
    """Return the stored form of a secret."""
    return hashlib.sha256(secret.encode()).hexdigest()


def parse_token(token: str) -> tuple[str, str] | None:
    """Split `amux.<token id>.<secret>`; None when malformed."""
    parts = token.split(".")
    if len(parts) != 3 or parts[0] != TOKEN_PREFIX or not parts[1] or not parts[2] or len(token) > 512:
        return None
    return parts[1], parts[2]


class OAuthVerifier(Protocol):
    """Resolve OAuth access tokens (hub/services/auth/oauth.py)."""

    def is_access_token(self, token: str) -> bool:
        """Return whether `token` has the shape of an OAuth access token (no I/O)."""

    async def verify_access_token(self, token: str) -> Caller:
        """Return the granting principal's Caller with the granted scopes, or raise Unauthorized."""

    def forget_grants(self, grant_ids: list[str]) -> None:
        """Drop these grants from this replica's verification cache (they were revoked here)."""


class AuthService:
    """Create principals and tokens; authenticate bearer tokens.

    Verified tokens are remembered for `cache_s` seconds (keyed by the secret's hash, never the token),
    so a revocation reaches every replica within that time; the database stays the only truth.
    """

    def __init__(self, db: Database, clock: Clock, cache_s: float = 5.0, *,
                 oauth: OAuthVerifier | None = None) -> None:
        self.db = db
        self.clock = clock
        self.cache_s = cache_s
        self.store = SqlTokenStore(db)
        self._verified: dict[str, tuple[float, Caller]] = {}
        # Called with a token id after a revocation made through this replica (the runner endpoint closes its sockets).
        self.revocation_listeners: list[Callable[[str], Any]] = []
        self.oauth = oauth  # OAuth access tokens of hosted MCP clients (hub/services/auth/oauth.py)

    async def ensure_principal(self, conn: Connection, name: str, kind: str = "user") -> str:
        """Return the id of principal `name`, creating it."""
        return await self.store.ensure_principal(conn, name, kind, self.clock.now(), new_id("pr"))

    # ------------------------------------------------------------ run tokens (one per task run)

    async def mint_run(self, conn: Connection, principal_id: str, task_id: str, label: str, *,
                       first: bool = False) -> str:
        """Mint the run token of `task_id` inside the caller's transaction; earlier tokens of that run are revoked
        (none can exist when this is the `first` dispatch of a run's first attempt: nothing is revoked then).

        A run token acts as the run's principal for memory and coordination calls only, and stops
        working when the run reaches a terminal status (checked at authentication) or is revoked.
        """
        return (await self.mint_runs(conn, [RunToken(principal_id, task_id, label, first)]))[0]

    async def mint_runs(self, conn: Connection, runs: list["RunToken"]) -> list[str]:
        """Mint the run tokens of several runs (a placement round's dispatches) as `mint_run` does each, with one
        statement for their revocations (runs not `first` only) and one INSERT; return the tokens in order."""
        now = self.clock.now()
        await self.revoke_runs(conn, [r.task_id for r in runs if not r.first])
        rows, tokens = [], []
        for r in runs:
            token_id, secret = new_id("tok"), secrets.token_urlsafe(32)
            rows.append(dict(id=token_id, principal_id=r.principal_id, label=r.label, token_hash=hash_secret(secret),
                             admin=False, created_at=now, kind="run", task_id=r.task_id))
            tokens.append(f"{TOKEN_PREFIX}.{token_id.split('_', 1)[1]}.{secret}")
        await self.store.add_tokens(conn, rows)
        return tokens

    async def revoke_runs(self, conn: Connection, task_ids: Collection[str]) -> None:
        """Revoke every live token of these task runs (a batch of reports that ended them), in one statement."""
        for token_id in await self.store.revoke_runs_tokens(conn, [t for t in task_ids if t], self.clock.now()):
            self.forget(token_id)

    async def create_token(self, principal: str, label: str | None = None, admin: bool = False, kind: str = "user",
                           *, runner: bool = False, replace: bool = False) -> str:
        """Create a token for `principal` (created if new) and return its plaintext, shown once.

        `runner`: a runner token (only /runner/ws); with `admin` it registers shared runtimes and is no admin token.
        `replace`: revoke the principal's other live tokens of the same kind and label (a token file made anew).
        """
        principal = principal.strip()
        if not principal or len(principal) > 200:
            raise Invalid("principal name must be 1–200 characters, e.g. --principal alice")
        if kind not in ("user", "service", "runtime"):
            raise Invalid("principal kind must be user, service or runtime")
        token_id = new_id("tok")
        secret = secrets.token_urlsafe(32)
        async with self.db.write() as conn:
            # Another replica may create the same principal at the same moment: then its row is used.
            pid = await self.ensure_principal(conn, principal, kind)
            token_kind = "runner" if runner else "admin" if admin else "user"
            label = label or ("runner" if runner else None)
            replaced = await self.store.revoke_alike(conn, pid, token_kind, label, self.clock.now()) if replace else []
            await self.store.add_token(conn, token_id=token_id, principal_id=pid, label=label,
                                       token_hash=hash_secret(secret), admin=admin, kind=token_kind,
                                       now=self.clock.now())
        for old in replaced:
            self.forget(old)
        return f"{TOKEN_PREFIX}.{token_id.split('_', 1)[1]}.{secret}"

    async def authenticate(self, header: str | None, *, surface: str = "api", fresh: bool = False) -> Caller:
        """Resolve an `Authorization` header (or bare token) to a Caller, or raise Unauthorized.

        `surface` is where the token is presented: runner tokens are accepted only on "runner"
        (/runner/ws), run tokens everywhere but there (each door narrows them further, see `run_token_refusal`).
        `fresh` skips the verification cache (runner connections: a revoked runner must not reconnect).
        """
        caller = await self._verify(header, fresh)
        return check_surface(caller, surface)

    async def _verify(self, header: str | None, fresh: bool = False) -> Caller:
        if not header:
            raise Unauthorized(MISSING)
        token = header[7:].strip() if header[:7].lower() == "bearer " else header.strip()
        parsed = parse_token(token)
        if parsed is None:
            raise Unauthorized(WRONG)
        token_id, secret = "tok_" + parsed[0], parsed[1]
        digest = hash_secret(secret)
        hit = None if fresh else self._verified.get(digest)
        if hit is not None and hit[0] > time.monotonic() and hit[1].token_id == token_id:
            return hit[1]
        async with self.db.read() as conn:
            row = await self.store.token_to_verify(conn, token_id)
        if row is None or not hmac.compare_digest(row.token_hash, digest) or row.revoked_at is not None:
            raise Unauthorized(WRONG)
        if row.kind == "run" and row.task_id is not None and (row.run_status is None or is_terminal(row.run_status)):
            raise Unauthorized(RUN_ENDED)  # whatever path ended the run, its token ends with it
        now = self.clock.now()
        last = utc(row.last_used_at)
        if last is None or now - last >= LAST_USED_GRANULARITY:
            async with self.db.write() as conn:
                await self.store.record_use(conn, token_id, now)
        caller = caller_of_row(row)
        if len(self._verified) > 10_000:
            self._verified.clear()
        self._verified[digest] = (time.monotonic() + self.cache_s, caller)
        return caller

    def forget(self, token_id: str) -> None:
        """Drop a token from this replica's verified-token cache (it was revoked here)."""
        for digest, (_, cached) in list(self._verified.items()):
            if cached.token_id == token_id:
                self._verified.pop(digest, None)

    async def authenticate_mcp(self, header: str | None) -> Caller:
        """Like `authenticate`, and also accept OAuth access tokens, whose audience is `/mcp` only."""
        token = (header[7:].strip() if header[:7].lower() == "bearer " else header.strip()) if header else ""
        if self.oauth is not None and self.oauth.is_access_token(token):
            return await self.oauth.verify_access_token(token)
        return await self.authenticate(header)


# ---------------------------------------------------------------- token kinds and lifecycle


def caller_of_row(row: Row) -> Caller:
    """Build the Caller of a token row (joined with its principal's name)."""
    kind = row.kind or ("admin" if row.admin else "user")
    if kind == "runner":  # the admin flag of a runner token means "shared runtime", never admin rights
        return Caller(row.principal_id, row.name, row.id, row.label, False, kind, None, bool(row.admin))
    if kind == "run":  # memory and coordination only: over MCP that is tasks and schedules, never leases/boxes
        return Caller(row.principal_id, row.name, row.id, row.label, False, kind, row.task_id, scopes=RUN_SCOPES)
    return Caller(row.principal_id, row.name, row.id, row.label, bool(row.admin) and kind == "admin", kind, row.task_id)


def check_surface(caller: Caller, surface: str) -> Caller:
    """Refuse a token kind where it does not belong; return the caller otherwise."""
    if caller.kind == "runner" and surface != "runner":
        raise Forbidden(RUNNER_ONLY)
    if caller.kind == "run" and surface == "runner":
        raise Forbidden(RUN_NOT_RUNNER)
    return caller


RUN_SCOPES = frozenset({"tasks", "schedules"})  # a run token's MCP scopes (hub/mcp/server.py TOOL_SCOPES)

# What a run token (a task child's AMUX_TOKEN) may reach, on every door alike: memory and coordination (delegated
# tasks, sessions and their turns, schedules, permission answers of its own delegations), and two reads. An area is
# the REST path segment after `/api/v1/` (`rest_area`); the MCP door maps each tool to one (hub/mcp/server.py).
RUN_TOKEN_AREAS = frozenset({"memory", "tasks", "sessions", "turns", "schedules"})
RUN_TOKEN_READS = frozenset({"whoami", "profiles"})


def run_token_may(area: str, *, read: bool) -> bool:
    """Return whether a run token may act on `area` (`read`: the call changes nothing)."""
    return area in RUN_TOKEN_AREAS or (read and area in RUN_TOKEN_READS)


def rest_area(path: str) -> str:
    """Return the area of a REST path: its segment after `/api/v1/` (`tasks` for `/api/v1/tasks/x/wait`)."""
    rest = path.removeprefix("/api/v1/")
    return rest.split("/", 1)[0] if rest != path else ""


def run_token_refusal(caller: Caller, area: str, *, read: bool, what: str) -> str | None:
    """Return the refusal of a run token's call outside memory and coordination (`what` names the call), or None."""
    if caller.kind == "run" and not run_token_may(area, read=read):
        return RUN_REFUSED.format(what=what)
    return None


RUN_REFUSED = ("a task run's AMUX_TOKEN is for memory and coordination calls only (memory, tasks, sessions, "
               "turns, schedules); use your own token (`amux token create --principal NAME`) for {what}")


APPROVE_REFUSED = ("a task run's AMUX_TOKEN cannot approve an MCP client: the grant would outlive the run; paste your "
                   "own token (`amux token create --principal NAME`) or sign in with a Feishu login link "
                   "(`/amux login`)")


def check_may_approve(caller: Caller) -> None:
    """Refuse an OAuth approval by a token whose rights end before a grant would (a run token)."""
    if caller.kind not in ("user", "admin"):
        raise Forbidden(APPROVE_REFUSED)


GRANT_PREFIX = "og_"  # OAuth grant ids (hub/services/auth/oauth.py), revoked through the same door as tokens
APPROVER_REVOKED = "the amux token that approved it was revoked"


class TokenAdmin:
    """List and revoke tokens and the OAuth grants they approved: an admin sees every one, a user their own; never
    a hash.

    Revocation is immediate in the database; replicas' verification caches forget a token within
    `AuthService.cache_s` (5 s), and `AuthService.revocation_listeners` (the runner endpoint) act at once locally.
    Revoking a token revokes the grants it approved (and verification checks the approving token as well).
    """

    def __init__(self, auth: AuthService) -> None:
        self.auth = auth
        self.grants = SqlOAuthStore(auth.db)

    @staticmethod
    def _may_manage(caller: Caller) -> None:
        if caller.kind not in ("user", "admin"):
            raise Forbidden(RUN_REFUSED.format(what="managing tokens"))

    async def list(self, caller: Caller, *, all_: bool = False, include_revoked: bool = True) -> list[dict]:
        """List the caller's tokens (an admin with `all_`: everyone's)."""
        self._may_manage(caller)
        if all_ and not caller.admin:
            raise Forbidden("only an admin lists every token; drop --all to list your own")
        async with self.auth.db.read() as conn:
            rows = await self.auth.store.list_tokens(conn, None if all_ else caller.principal_id,
                                                     include_revoked=include_revoked)
        return [token_view(r) for r in rows]

    async def list_grants(self, caller: Caller, *, all_: bool = False) -> builtins.list[dict]:
        """List the caller's live OAuth grants (an admin with `all_`: everyone's)."""
        self._may_manage(caller)
        if all_ and not caller.admin:
            raise Forbidden("only an admin lists every grant; drop --all to list your own")
        async with self.auth.db.read() as conn:
            rows = await self.grants.live_grants(conn, None if all_ else caller.principal_id)
        return [{"id": r.id, "principal": r.principal, "client": r.client_name, "scopes": r.scope.split(),
                 "approved_by": r.approved_by, "created": _iso(r.created_at)} for r in rows]

    async def create(self, caller: Caller, principal: str | None = None, *, label: str | None = None,
                     admin: bool = False, runner: bool = False) -> dict:
        """Create a token: a user for themselves (user or runner kind), an admin for anyone and any kind."""
        self._may_manage(caller)
        target = (principal or caller.principal).strip()
        if not caller.admin and (admin or target != caller.principal):
            raise Forbidden("only an admin creates admin tokens or tokens for another principal; "
                            "create your own with no --principal and no --admin")
        shared = admin and runner  # a runner token made by an admin registers shared runtimes
        token = await self.auth.create_token(target, label=label, admin=admin, runner=runner)
        token_id = "tok_" + token.split(".")[1]
        return {"id": token_id, "principal": target, "kind": "runner" if runner else "admin" if admin else "user",
                "label": label or ("runner" if runner else None), "shared": shared, "token": token}

    async def revoke(self, caller: Caller, token_id: str) -> dict:
        """Revoke a token and the grants it approved, or an OAuth grant by its id (idempotent): your own, or
        anyone's as an admin."""
        self._may_manage(caller)
        if token_id.startswith(GRANT_PREFIX):
            return await self._revoke_grant(caller, token_id)
        now = self.auth.clock.now()
        async with self.auth.db.write() as conn:
            row = await self.auth.store.token(conn, token_id)
            if row is None or (row.principal_id != caller.principal_id and not caller.admin):
                raise NotFound(f"token {token_id} does not exist or is not yours; list yours with `amux token list`")
            await self.auth.store.revoke_token(conn, token_id, now)
            grants = await self.grants.revoke_approved_by(conn, token_id, now, APPROVER_REVOKED)
        self.auth.forget(token_id)
        if self.auth.oauth is not None:
            self.auth.oauth.forget_grants(grants)
        for fn in self.auth.revocation_listeners:
            fn(token_id)
        view = [t for t in await self.list(caller, all_=caller.admin) if t["id"] == token_id]
        return view[0] if view else {"id": token_id, "revoked": True}

    async def _revoke_grant(self, caller: Caller, grant_id: str) -> dict:
        async with self.auth.db.write() as conn:
            row = await self.grants.grant(conn, grant_id)
            if row is None or (row.principal_id != caller.principal_id and not caller.admin):
                raise NotFound(f"grant {grant_id} does not exist or is not yours; list yours with `amux token list`")
            await self.grants.revoke_grant(conn, grant_id, self.auth.clock.now(), "revoked with `amux token revoke`")
        if self.auth.oauth is not None:
            self.auth.oauth.forget_grants([grant_id])
        return {"id": grant_id, "kind": "grant", "revoked": True}


def _iso(v: datetime | None) -> str | None:
    dt = utc(v)
    return dt.isoformat() if dt is not None else None


def token_view(r: Row) -> dict:
    """Show a token as id/kind/label/created/last_used/revoked (never its hash)."""
    out = {"id": r.id, "principal": r.principal, "kind": r.kind, "label": r.label,
           "created": _iso(r.created_at), "last_used": _iso(r.last_used_at), "revoked": _iso(r.revoked_at)}
    if r.kind == "runner":
        out["shared"] = bool(r.admin)
    if r.task_id:
        out["task_id"] = r.task_id
    return out
