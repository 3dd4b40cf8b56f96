"""Principals, API tokens and the OAuth server's records: secrets only ever arrive here as their hashes."""
from __future__ import annotations

from datetime import datetime
from typing import Any, Collection

import sqlalchemy as sa

from .db import Connection, Database, Row, execute_many, insert_new, one_of
from .tables import (api_tokens, oauth_clients, oauth_codes, oauth_grants, oauth_logins, oauth_tokens, principals,
                     task_runs)

# Every dispatch mints a run token and every finish revokes it: these statements are built once.
_INSERT_TOKEN = api_tokens.insert()
_REVOKE_RUNS = (api_tokens.update().where(one_of(api_tokens.c.task_id, "b_task_ids"), api_tokens.c.revoked_at.is_(None))
                .values(revoked_at=sa.bindparam("b_now")).returning(api_tokens.c.id))
_ADD_TOKENS = api_tokens.insert()


class SqlTokenStore:
    """Principals and API tokens (user, admin, runner and per-run tokens)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    # --- principals ------------------------------------------------------------------------------

    async def ensure_principal(self, conn: Connection, name: str, kind: str, now: datetime, new_id: str) -> str:
        """Return the id of principal `name`, creating it with id `new_id`; when another transaction creates it
        at the same moment, its row wins (names are unique) and this transaction stays usable."""
        found = await self.principal_id(conn, name)
        if found is not None:
            return found
        if await insert_new(conn, principals, dict(id=new_id, kind=kind, name=name, created_at=now), ["name"]):
            return new_id
        found = await self.principal_id(conn, name)
        if found is None:
            raise RuntimeError(f"principal {name!r} could neither be created nor read")
        return found

    async def principal_id(self, conn: Connection, name: str) -> str | None:
        """Return the id of the principal called `name`, or None."""
        return (await conn.execute(sa.select(principals.c.id).where(principals.c.name == name))).scalar()

    async def principal_name(self, conn: Connection, principal_id: str) -> str | None:
        """Return a principal's name, or None when there is no such principal."""
        return (await conn.execute(sa.select(principals.c.name).where(principals.c.id == principal_id))).scalar()

    # --- tokens ----------------------------------------------------------------------------------

    async def add_token(self, conn: Connection, *, token_id: str, principal_id: str, label: str | None,
                        token_hash: str, admin: bool, kind: str, now: datetime, task_id: str | None = None) -> None:
        """Store a new token by the hash of its secret (the secret itself is never stored)."""
        await conn.execute(_INSERT_TOKEN, dict(
            id=token_id, principal_id=principal_id, label=label, token_hash=token_hash, admin=admin, created_at=now,
            kind=kind, task_id=task_id))

    async def add_tokens(self, conn: Connection, rows: list[dict[str, Any]]) -> None:
        """Store new tokens (rows of `api_tokens`, by the hashes of their secrets) with one INSERT."""
        await execute_many(conn, _ADD_TOKENS, rows)

    async def revoke_alike(self, conn: Connection, principal_id: str, kind: str, label: str | None,
                           now: datetime) -> list[str]:
        """Revoke the principal's live tokens of this kind and label; return their ids."""
        res = await conn.execute(api_tokens.update().where(
            api_tokens.c.principal_id == principal_id, api_tokens.c.kind == kind, api_tokens.c.label == label,
            api_tokens.c.revoked_at.is_(None)).values(revoked_at=now).returning(api_tokens.c.id))
        return list(res.scalars().all())

    async def revoke_runs_tokens(self, conn: Connection, task_ids: Collection[str], now: datetime) -> list[str]:
        """Revoke every live token of these task runs in one statement; return the ids revoked now."""
        if not task_ids:
            return []
        res = await conn.execute(_REVOKE_RUNS, {"b_task_ids": sorted(set(task_ids)), "b_now": now})
        return list(res.scalars().all())

    async def token_to_verify(self, conn: Connection, token_id: str) -> Row | None:
        """Return a token with its principal's `name` and its run's `run_status` (None when it names no live run
        row), hash included: the caller compares it in constant time."""
        return (await conn.execute(
            sa.select(api_tokens, principals.c.name, task_runs.c.status.label("run_status"))
            .join(principals, principals.c.id == api_tokens.c.principal_id)
            .outerjoin(task_runs, task_runs.c.id == api_tokens.c.task_id)
            .where(api_tokens.c.id == token_id))).first()

    async def record_use(self, conn: Connection, token_id: str, now: datetime) -> None:
        """Record that the token was used at `now` (the caller decides how often that is worth a write)."""
        await conn.execute(api_tokens.update().where(api_tokens.c.id == token_id).values(last_used_at=now))

    async def token(self, conn: Connection, token_id: str) -> Row | None:
        """Return one token row (its hash included: for checks only, never for a view), or None."""
        return (await conn.execute(sa.select(api_tokens).where(api_tokens.c.id == token_id))).first()

    async def list_tokens(self, conn: Connection, principal_id: str | None, *, include_revoked: bool) -> list[Row]:
        """List tokens with their `principal` name, oldest first: one principal's, or everyone's for None; no hash."""
        q = (sa.select(api_tokens.c.id, api_tokens.c.kind, api_tokens.c.label, api_tokens.c.admin, api_tokens.c.task_id,
                       api_tokens.c.created_at, api_tokens.c.last_used_at, api_tokens.c.revoked_at,
                       principals.c.name.label("principal"))
             .join(principals, principals.c.id == api_tokens.c.principal_id).order_by(api_tokens.c.created_at))
        if principal_id is not None:
            q = q.where(api_tokens.c.principal_id == principal_id)
        if not include_revoked:
            q = q.where(api_tokens.c.revoked_at.is_(None))
        return list((await conn.execute(q)).all())

    async def revoke_token(self, conn: Connection, token_id: str, now: datetime) -> bool:
        """Revoke a token unless it is revoked already (its first revocation time stays); return whether it was
        revoked now."""
        res = await conn.execute(api_tokens.update().where(api_tokens.c.id == token_id,
                                                            api_tokens.c.revoked_at.is_(None)).values(revoked_at=now))
        return res.rowcount == 1


_APPROVER = api_tokens.alias("approver")  # the amux token that approved a grant


class SqlOAuthStore:
    """The authorization server's clients, codes, grants, token pairs and sign-in links.

    Every secret (client secret, code, token, login link, browser session) is keyed by its hash; a grant is
    the family of tokens one approval issued, and revoking it ends every token of it.
    """

    def __init__(self, db: Database) -> None:
        self.db = db

    # --- clients ---------------------------------------------------------------------------------

    async def add_client(self, conn: Connection, *, client_id: str, secret_hash: str | None, name: str,
                         redirect_uris: list[str], scope: str, auth_method: str, info: dict[str, Any],
                         now: datetime) -> None:
        """Register a client (its secret, when it has one, by hash only)."""
        await conn.execute(oauth_clients.insert().values(
            id=client_id, secret_hash=secret_hash, name=name, redirect_uris=redirect_uris, scope=scope,
            auth_method=auth_method, info=info, created_at=now))

    async def client(self, conn: Connection, client_id: str) -> Row | None:
        """Return a registered client, or None."""
        return (await conn.execute(sa.select(oauth_clients).where(oauth_clients.c.id == client_id))).first()

    async def prune_unused_clients(self, conn: Connection, *, created_before: datetime, limit: int) -> int:
        """Delete up to `limit` clients registered before `created_before` that never completed an authorization
        (no grant) and hold no code made since then, with their old codes; return how many clients went.

        Safe on any number of replicas at once: the conditions are checked again by the DELETE itself, so a client
        that another replica is authorizing meanwhile stays (at worst a foreign-key error aborts this pass).
        """
        c = oauth_clients.c
        unused = sa.and_(
            c.created_at < created_before,
            ~sa.select(oauth_grants.c.id).where(oauth_grants.c.client_id == c.id).exists(),
            ~sa.select(oauth_codes.c.code_hash).where(oauth_codes.c.client_id == c.id,
                                                      oauth_codes.c.created_at >= created_before).exists())
        ids = list((await conn.execute(sa.select(c.id).where(unused).limit(limit))).scalars())
        if not ids:
            return 0
        await conn.execute(oauth_codes.delete().where(oauth_codes.c.client_id.in_(ids),
                                                      oauth_codes.c.created_at < created_before))
        return int((await conn.execute(oauth_clients.delete().where(c.id.in_(ids), unused))).rowcount)

    # --- authorization codes ---------------------------------------------------------------------

    async def add_code(self, conn: Connection, *, code_hash: str, client_id: str, principal_id: str,
                       redirect_uri: str, redirect_explicit: bool, code_challenge: str, scope: str,
                       resource: str | None, expires_at: datetime, now: datetime,
                       approved_by: str | None = None) -> None:
        """Store an approved authorization code by its hash, unused, expiring at `expires_at`, with the amux token
        that approved it (`approved_by`, None for a browser sign-in)."""
        await conn.execute(oauth_codes.insert().values(
            code_hash=code_hash, client_id=client_id, principal_id=principal_id, redirect_uri=redirect_uri,
            redirect_explicit=redirect_explicit, code_challenge=code_challenge, scope=scope, resource=resource,
            expires_at=expires_at, created_at=now, approved_by=approved_by))

    async def code_to_exchange(self, conn: Connection, code_hash: str) -> Row | None:
        """Return the code row locked for this transaction, so two exchanges of one code run one after the other."""
        return (await conn.execute(self.db.for_update(
            sa.select(oauth_codes).where(oauth_codes.c.code_hash == code_hash)))).first()

    async def spend_code(self, conn: Connection, code_hash: str, now: datetime) -> None:
        """Mark a code used: any exchange attempt spends it, so a wrong verifier cannot be retried against it."""
        await conn.execute(oauth_codes.update().where(oauth_codes.c.code_hash == code_hash).values(used_at=now))

    async def grant_code(self, conn: Connection, code: Row, grant_id: str, now: datetime) -> None:
        """Open the grant a code issues (its client, principal, scope, resource and approving token) and remember it
        on the code, so replaying the code revokes what it issued."""
        await conn.execute(oauth_grants.insert().values(
            id=grant_id, client_id=code.client_id, principal_id=code.principal_id, scope=code.scope,
            resource=code.resource, created_at=now, approved_by=code.approved_by))
        await conn.execute(oauth_codes.update().where(oauth_codes.c.code_hash == code.code_hash)
                           .values(grant_id=grant_id))

    # --- grants and tokens -----------------------------------------------------------------------

    async def add_token_pair(self, conn: Connection, grant_id: str, scope: str, *, access_hash: str,
                             access_expires_at: datetime, refresh_hash: str, refresh_expires_at: datetime,
                             now: datetime) -> None:
        """Store an access and a refresh token of a grant, by their hashes."""
        await conn.execute(oauth_tokens.insert(), [
            dict(token_hash=access_hash, grant_id=grant_id, kind="access", scope=scope,
                 expires_at=access_expires_at, created_at=now),
            dict(token_hash=refresh_hash, grant_id=grant_id, kind="refresh", scope=scope,
                 expires_at=refresh_expires_at, created_at=now),
        ])

    async def refresh_to_rotate(self, conn: Connection, token_hash: str) -> Row | None:
        """Return a refresh token with its grant's `client_id`, `revoked_at`, `grant_scope` and its approving token's
        `approver_revoked_at`, locked for this transaction so two rotations of one token run one after the other."""
        return (await conn.execute(self.db.for_update(
            sa.select(oauth_tokens, oauth_grants.c.client_id, oauth_grants.c.revoked_at,
                      oauth_grants.c.scope.label("grant_scope"), _APPROVER.c.revoked_at.label("approver_revoked_at"))
            .join(oauth_grants, oauth_grants.c.id == oauth_tokens.c.grant_id)
            .outerjoin(_APPROVER, _APPROVER.c.id == oauth_grants.c.approved_by)
            .where(oauth_tokens.c.token_hash == token_hash, oauth_tokens.c.kind == "refresh"),
            of=oauth_tokens))).first()

    async def rotate(self, conn: Connection, token_hash: str, now: datetime) -> None:
        """Mark a refresh token rotated: presenting it again is a reuse."""
        await conn.execute(oauth_tokens.update().where(oauth_tokens.c.token_hash == token_hash).values(rotated_at=now))

    async def grant_of(self, conn: Connection, token_hash: str, client_id: str) -> str | None:
        """Return the grant a token (access or refresh) of this client belongs to; None for another client's."""
        return (await conn.execute(
            sa.select(oauth_tokens.c.grant_id).join(oauth_grants, oauth_grants.c.id == oauth_tokens.c.grant_id)
            .where(oauth_tokens.c.token_hash == token_hash, oauth_grants.c.client_id == client_id))).scalar()

    async def revoke_grant(self, conn: Connection, grant_id: str, now: datetime, reason: str) -> None:
        """Revoke a grant, which ends every token of it; a revoked grant keeps its first time and reason."""
        await conn.execute(oauth_grants.update()
                           .where(oauth_grants.c.id == grant_id, oauth_grants.c.revoked_at.is_(None))
                           .values(revoked_at=now, revoked_reason=reason))

    async def revoke_approved_by(self, conn: Connection, token_id: str, now: datetime, reason: str) -> list[str]:
        """Revoke every live grant the amux token `token_id` approved; return their ids."""
        res = await conn.execute(oauth_grants.update()
                                 .where(oauth_grants.c.approved_by == token_id, oauth_grants.c.revoked_at.is_(None))
                                 .values(revoked_at=now, revoked_reason=reason).returning(oauth_grants.c.id))
        return list(res.scalars().all())

    async def grant(self, conn: Connection, grant_id: str) -> Row | None:
        """Return one grant row, or None."""
        return (await conn.execute(sa.select(oauth_grants).where(oauth_grants.c.id == grant_id))).first()

    async def live_grants(self, conn: Connection, principal_id: str | None) -> list[Row]:
        """List the unrevoked grants whose approving token (if any) is unrevoked, oldest first, with the client's
        `client_name` and the principal's name as `principal`: one principal's, or everyone's for None."""
        q = (sa.select(oauth_grants.c.id, oauth_grants.c.scope, oauth_grants.c.approved_by, oauth_grants.c.created_at,
                       oauth_clients.c.name.label("client_name"), principals.c.name.label("principal"))
             .join(oauth_clients, oauth_clients.c.id == oauth_grants.c.client_id)
             .join(principals, principals.c.id == oauth_grants.c.principal_id)
             .outerjoin(_APPROVER, _APPROVER.c.id == oauth_grants.c.approved_by)
             .where(oauth_grants.c.revoked_at.is_(None), _APPROVER.c.revoked_at.is_(None))
             .order_by(oauth_grants.c.created_at, oauth_grants.c.id))
        if principal_id is not None:
            q = q.where(oauth_grants.c.principal_id == principal_id)
        return list((await conn.execute(q)).all())

    async def access_token(self, conn: Connection, token_hash: str) -> Row | None:
        """Return an access token's `scope` and `expires_at` with its grant (`id`, `revoked_at`, `principal_id`),
        the principal's `name`, the client's `client_name` and the approving token's `approver_revoked_at`; None for
        an unknown hash or a refresh token."""
        return (await conn.execute(
            sa.select(oauth_tokens.c.scope, oauth_tokens.c.expires_at, oauth_grants.c.id, oauth_grants.c.revoked_at,
                      oauth_grants.c.principal_id, principals.c.name, oauth_clients.c.name.label("client_name"),
                      _APPROVER.c.revoked_at.label("approver_revoked_at"))
            .join(oauth_grants, oauth_grants.c.id == oauth_tokens.c.grant_id)
            .join(principals, principals.c.id == oauth_grants.c.principal_id)
            .join(oauth_clients, oauth_clients.c.id == oauth_grants.c.client_id)
            .outerjoin(_APPROVER, _APPROVER.c.id == oauth_grants.c.approved_by)
            .where(oauth_tokens.c.token_hash == token_hash, oauth_tokens.c.kind == "access"))).first()

    # --- sign-in links and browser sessions ------------------------------------------------------

    async def add_login(self, conn: Connection, secret_hash: str, kind: str, principal_id: str, *,
                        expires_at: datetime, now: datetime) -> None:
        """Store a sign-in secret by its hash: a one-time `link` or a browser `session`."""
        await conn.execute(oauth_logins.insert().values(
            secret_hash=secret_hash, kind=kind, principal_id=principal_id, expires_at=expires_at, created_at=now))

    async def link_to_redeem(self, conn: Connection, secret_hash: str) -> Row | None:
        """Return a sign-in link with its principal's `name`, locked for this transaction so it is spent once."""
        return (await conn.execute(self.db.for_update(
            sa.select(oauth_logins, principals.c.name).join(principals, principals.c.id == oauth_logins.c.principal_id)
            .where(oauth_logins.c.secret_hash == secret_hash, oauth_logins.c.kind == "link")))).first()

    async def spend_login(self, conn: Connection, secret_hash: str, now: datetime) -> None:
        """Mark a sign-in link used."""
        await conn.execute(oauth_logins.update().where(oauth_logins.c.secret_hash == secret_hash).values(used_at=now))

    async def session(self, conn: Connection, secret_hash: str) -> Row | None:
        """Return a browser session's `principal_id`, `expires_at` and principal `name`, or None."""
        return (await conn.execute(
            sa.select(oauth_logins.c.principal_id, oauth_logins.c.expires_at, principals.c.name)
            .join(principals, principals.c.id == oauth_logins.c.principal_id)
            .where(oauth_logins.c.secret_hash == secret_hash, oauth_logins.c.kind == "session"))).first()
