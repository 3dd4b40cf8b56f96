"""`/api/v1/alerts…` and `/api/v1/feishu/apps/{app}/recheck`: REST over the AlertService (the CLI uses it)."""
from __future__ import annotations

from typing import Any, Awaitable, Callable

from aiohttp import web

from ..errors import AmuxError, Forbidden
from .rest import CALLER, error_response


def add_routes(app: web.Application, hub: Any) -> None:
    """Register the alert endpoints (administrators only: the alert center is the operator's view)."""
    alerts = hub.alerts
    r = app.router

    def wrap(fn: Callable[[web.Request], Awaitable[Any]]) -> Callable:
        async def handler(request: web.Request) -> web.Response:
            try:
                if not request[CALLER].admin:
                    raise Forbidden("the alert center needs an admin token; create one with `amux token create --admin`")
                return web.json_response(await fn(request))
            except AmuxError as e:
                return error_response(e, request)
        return handler

    async def explain(request: web.Request) -> dict:
        return await alerts.explain(request.match_info["ref"])

    async def listing(request: web.Request) -> dict:
        return {"incidents": await alerts.list_incidents(request.query.get("all") not in ("1", "true")),
                "diagnostics": await alerts.diagnostics()}

    async def control(request: web.Request) -> dict:
        iid, action = request.match_info["id"], request.match_info["action"]
        if action == "ack":
            return await alerts.acknowledge(iid, request[CALLER].principal)
        if action == "snooze":
            return await alerts.snooze(iid)
        if action == "pause":
            return await alerts.pause(request[CALLER], iid)
        raise AmuxError(f"unknown action {action!r}; use ack, snooze or pause")

    async def recheck(request: web.Request) -> dict:
        return await alerts.recheck(request.match_info["app"])

    r.add_get("/api/v1/alerts", wrap(listing))
    r.add_get("/api/v1/alerts/explain/{ref}", wrap(explain))
    r.add_post("/api/v1/alerts/incidents/{id}/{action}", wrap(control))
    r.add_post("/api/v1/feishu/apps/{app}/recheck", wrap(recheck))
