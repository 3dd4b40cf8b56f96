"""`/api/v1/identity…`: link codes and identity bindings over REST (the CLI's `amux identity …`)."""
from __future__ import annotations

from typing import Any, Awaitable, Callable

from aiohttp import web

from ..errors import AmuxError
from .rest import CALLER, error_response


def add_routes(app: web.Application, hub: Any) -> None:
    """Register `POST /api/v1/identity/link-codes`, `GET /api/v1/identities`, `DELETE /api/v1/identities/{id}`."""
    identity = hub.identity
    r = app.router

    def wrap(fn: Callable[[web.Request], Awaitable[Any]], status: int = 200) -> Callable:
        async def handler(request: web.Request) -> web.Response:
            try:
                return web.json_response(await fn(request), status=status)
            except AmuxError as e:
                return error_response(e, request)
        return handler

    async def link_code(request: web.Request) -> dict:
        return await identity.create_link_code(request[CALLER])

    async def listing(request: web.Request) -> dict:
        everyone = request.query.get("all") in ("1", "true")
        return {"identities": await identity.list(request[CALLER], everyone)}

    async def unlink(request: web.Request) -> dict:
        return await identity.unlink(request[CALLER], request.match_info["id"])

    r.add_post("/api/v1/identity/link-codes", wrap(link_code, 201))
    r.add_get("/api/v1/identities", wrap(listing))
    r.add_delete("/api/v1/identities/{id}", wrap(unlink))
