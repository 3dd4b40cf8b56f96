"""`/api/v1/identity…`: link codes and identity bindings over REST (the CLI's `amux identity …`)."""
from __future__ import annotations

from aiohttp import web

from ..services.auth.identity import IdentityService

from . import api_models as m
from .api_models import Call, flag, register


def add_routes(app: web.Application, identity: IdentityService) -> None:
    """Register `POST /api/v1/identity/link-codes`, `GET /api/v1/identities`, `DELETE /api/v1/identities/{id}`,
    `PUT /api/v1/principals/{ref}/execution`."""

    async def link_code(c: Call) -> dict:
        return await identity.create_link_code(c.caller)

    async def listing(c: Call) -> dict:
        return {"identities": await identity.list(c.caller, flag(c.query.all))}

    async def unlink(c: Call) -> dict:
        return await identity.unlink(c.caller, c.path.id)

    async def execution(c: Call) -> dict:
        return await identity.set_execution_access(c.caller, c.path.ref, revoked=c.body.revoked)

    for o, fn in ((m.LINK_CODE, link_code), (m.IDENTITY_LIST, listing), (m.IDENTITY_UNLINK, unlink),
                  (m.EXECUTION_ACCESS, execution)):
        register(app, o, fn)
