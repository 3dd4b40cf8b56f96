"""`/api/v1/schedules…`: REST over the ScheduleService (the CLI uses it)."""
from __future__ import annotations

from typing import Any, Awaitable, Callable

from aiohttp import web

from ..errors import AmuxError, Invalid
from ..services.schedules import ScheduleService, ScheduleSpec
from .rest import CALLER, _body, _int, error_response


def add_routes(app: web.Application, hub: Any) -> None:
    """Register the schedule endpoints."""
    service: ScheduleService = hub.schedules
    r = app.router

    def wrap(fn: Callable[[web.Request], Awaitable[Any]], status: int = 200) -> Callable:
        async def handler(request: web.Request) -> web.Response:
            try:
                return web.json_response(await fn(request), status=status)
            except AmuxError as e:
                return error_response(e, request)
        return handler

    async def create(request: web.Request) -> dict:
        data = await _body(request)
        source = data.pop("source", "rest")
        if source not in ("rest", "cli"):
            raise Invalid('source must be "rest" or "cli"')
        return await service.create(request[CALLER], ScheduleSpec.from_dict(data), source=source)

    async def listing(request: web.Request) -> dict:
        everyone = request.query.get("all") in ("1", "true")
        return {"schedules": await service.list(request[CALLER], _int(request, "limit", 100), everyone)}

    async def get(request: web.Request) -> dict:
        return await service.get(request[CALLER], request.match_info["id"])

    async def update(request: web.Request) -> dict:
        return await service.update(request[CALLER], request.match_info["id"], ScheduleSpec.from_dict(await _body(request)))

    async def pause(request: web.Request) -> dict:
        return await service.pause(request[CALLER], request.match_info["id"])

    async def resume(request: web.Request) -> dict:
        return await service.resume(request[CALLER], request.match_info["id"])

    async def delete(request: web.Request) -> dict:
        return await service.delete(request[CALLER], request.match_info["id"])

    async def history(request: web.Request) -> dict:
        return await service.history(request[CALLER], request.match_info["id"], _int(request, "cursor", 0),
                                     _int(request, "limit", 50))

    r.add_post("/api/v1/schedules", wrap(create, 201))
    r.add_get("/api/v1/schedules", wrap(listing))
    r.add_get("/api/v1/schedules/{id}", wrap(get))
    r.add_patch("/api/v1/schedules/{id}", wrap(update))
    r.add_post("/api/v1/schedules/{id}/pause", wrap(pause))
    r.add_post("/api/v1/schedules/{id}/resume", wrap(resume))
    r.add_delete("/api/v1/schedules/{id}", wrap(delete))
    r.add_get("/api/v1/schedules/{id}/history", wrap(history))
