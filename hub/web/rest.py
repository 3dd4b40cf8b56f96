"""`/api/v1`: JSON REST for the CLI and pages; same services as MCP."""
from __future__ import annotations

import json
from typing import Any, Awaitable, Callable

import sqlalchemy as sa
from aiohttp import web

from ..domain.text import BadText, loads
from ..errors import AmuxError, Forbidden, Invalid
from ..services.auth import RUN_REFUSED, AuthService, Caller, TokenAdmin, run_token_may
from ..services.tasks import SubmitRequest, TaskService
from ..store.db import Database
from ..store.tables import runtimes
from .edge import REQUEST_ID

CALLER = web.RequestKey("caller", Caller)
MAX_BODY = 1024 * 1024
SUBMIT_FIELDS = {"prompt", "profile", "runtime", "model", "extra_args", "timeout_s", "name",
                 "reasoning_effort", "permission_policy", "credential_profile"}


def error_response(e: AmuxError, request: web.Request | None = None) -> web.Response:
    """Render a refusal as JSON with its status: `error` (code), `fix` (what to do; also as `message`), `request_id`."""
    body = {"error": e.code, "fix": e.message, "message": e.message}
    if request is not None and REQUEST_ID in request:
        body["request_id"] = request[REQUEST_ID]
    return web.json_response(body, status=e.status)


def auth_middleware(auth: AuthService) -> Callable:
    """Authenticate every `/api/` request; 401 names the fix."""

    @web.middleware
    async def middleware(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        if not request.path.startswith("/api/"):
            return await handler(request)
        try:
            caller = await auth.authenticate(request.headers.get("Authorization"))
            if caller.kind == "run" and not run_token_may(request.method, request.path):
                raise Forbidden(RUN_REFUSED.format(what=f"{request.method} {request.path}"))
            request[CALLER] = caller
            return await handler(request)
        except AmuxError as e:
            return error_response(e, request)

    return middleware


async def _body(request: web.Request) -> dict[str, Any]:
    if request.content_length and request.content_length > MAX_BODY:
        raise Invalid(f"request body is larger than {MAX_BODY} bytes; send less")
    try:
        data = loads(await request.read() or b"{}")
    except BadText as e:
        raise Invalid(str(e)) from e
    if not isinstance(data, dict):
        raise Invalid("request body must be a JSON object")
    return data


def _int(request: web.Request, key: str, default: int, lo: int = 0, hi: int = 2**31 - 1) -> int:
    raw = request.query.get(key)
    if raw is None:
        return default
    if not raw.isdigit() or not lo <= int(raw) <= hi:
        raise Invalid(f"query parameter {key} must be a whole number from {lo} to {hi}, e.g. ?{key}={default}")
    return int(raw)


def add_routes(app: web.Application, hub: Any) -> None:
    """Register the REST endpoints over the hub's services."""
    r = app.router
    tasks: TaskService = hub.tasks
    db: Database = hub.db

    async def whoami(request: web.Request) -> web.Response:
        c: Caller = request[CALLER]
        return web.json_response({"principal": c.principal, "label": c.label, "admin": c.admin})

    async def profiles(_: web.Request) -> web.Response:
        return web.json_response({"profiles": await hub.profiles.list()})

    async def profile_add(request: web.Request) -> web.Response:
        text = (await request.read()).decode(errors="replace")
        return web.json_response(await hub.profiles.add(request[CALLER], text), status=201)

    async def credential_list(_: web.Request) -> web.Response:
        return web.json_response({"credential_profiles": await hub.credentials.list()})

    async def credential_declare(request: web.Request) -> web.Response:
        data = await _body(request)
        env = data.get("env")
        if not isinstance(env, list):
            raise Invalid('send {"env": ["VAR", ...]}')
        return web.json_response(await hub.credentials.declare(request[CALLER], request.match_info["name"], env), status=201)

    async def credential_set(request: web.Request) -> web.Response:
        data = await _body(request)
        value = data.get("value")
        if not isinstance(value, str):
            raise Invalid('send {"value": "..."}')
        return web.json_response(await hub.credentials.set_value(
            request[CALLER], request.match_info["name"], request.match_info["env"], value))

    async def session_create(request: web.Request) -> web.Response:
        data = await _body(request)
        allowed = {"name", "profile", "model", "reasoning_effort", "runtime", "permission_policy", "extra_args"}
        if set(data) - allowed:
            raise Invalid(f"unknown fields {sorted(set(data) - allowed)}; a session takes {sorted(allowed)}")
        return web.json_response(await hub.sessions.create(request[CALLER], **data), status=201)

    async def session_show(request: web.Request) -> web.Response:
        sid = await hub.sessions.resolve_ref(request[CALLER], request.match_info["ref"])
        return web.json_response(await hub.sessions.show(request[CALLER], sid))

    async def session_send(request: web.Request) -> web.Response:
        data = await _body(request)
        if not isinstance(data.get("text"), str):
            raise Invalid('send {"text": "..."}')
        timeout = data.get("timeout_s", 600)
        if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not 0 < timeout <= 3600:
            raise Invalid("timeout_s must be a number of seconds from 1 to 3600, e.g. 600")
        caller = request[CALLER]
        sid = await hub.sessions.resolve_ref(caller, request.match_info["ref"])
        turn_id = await hub.sessions.submit_turn(caller, sid, data["text"], source="rest")
        if data.get("wait"):
            return web.json_response(await hub.sessions.wait_turn(caller, turn_id, float(timeout)))
        return web.json_response({"session_id": sid, "turn_id": turn_id, "status": "queued"}, status=201)

    async def turn_get(request: web.Request) -> web.Response:
        return web.json_response(await hub.sessions.get_turn(request[CALLER], request.match_info["id"]))

    async def memory_list(request: web.Request) -> web.Response:
        return web.json_response(await hub.memory.list(request[CALLER]))

    async def memory_get(request: web.Request) -> web.Response:
        return web.json_response(await hub.memory.get(request[CALLER], request.match_info["key"]))

    async def memory_put(request: web.Request) -> web.Response:
        data = await _body(request)
        return web.json_response(await hub.memory.set(request[CALLER], request.match_info["key"], data.get("value")))

    async def memory_delete(request: web.Request) -> web.Response:
        return web.json_response(await hub.memory.delete(request[CALLER], request.match_info["key"]))

    async def permission(request: web.Request) -> web.Response:
        data = await _body(request)
        if not isinstance(data.get("allow"), bool) or not isinstance(data.get("request_id"), str):
            raise Invalid('send {"request_id": "...", "allow": true|false, "message": "optional"}')
        return web.json_response(await hub.permissions.respond(
            request[CALLER], request.match_info["id"], data["request_id"], data["allow"], str(data.get("message") or "")))

    async def submit(request: web.Request) -> web.Response:
        data = await _body(request)
        unknown = set(data) - SUBMIT_FIELDS
        if unknown:
            raise Invalid(f"unknown fields {sorted(unknown)}; a task takes {sorted(SUBMIT_FIELDS)}")
        if "prompt" not in data:
            raise Invalid("prompt is required")
        return web.json_response(await tasks.submit(request[CALLER], SubmitRequest(**data)), status=201)

    async def task_list(request: web.Request) -> web.Response:
        return web.json_response({"tasks": await tasks.list(request[CALLER], _int(request, "limit", 50))})

    async def get(request: web.Request) -> web.Response:
        return web.json_response(await tasks.get(request[CALLER], request.match_info["id"]))

    async def events(request: web.Request) -> web.Response:
        return web.json_response(await tasks.events(request[CALLER], request.match_info["id"], _int(request, "cursor", 0)))

    async def wait(request: web.Request) -> web.Response:
        try:
            timeout = float(request.query.get("timeout_s", 30))
        except ValueError:
            timeout = -1.0
        if not 0 <= timeout <= 600:  # also refuses nan and inf
            raise Invalid("timeout_s must be a number of seconds from 0 to 600, e.g. ?timeout_s=30")
        return web.json_response(await tasks.wait(request[CALLER], request.match_info["id"], _int(request, "cursor", 0), timeout))

    async def cancel(request: web.Request) -> web.Response:
        return web.json_response(await tasks.cancel(request[CALLER], request.match_info["id"]))

    async def runtime_list(_: web.Request) -> web.Response:
        async with db.read() as conn:
            rows = (await conn.execute(sa.select(runtimes).order_by(runtimes.c.name))).all()
        return web.json_response({"runtimes": [
            {"id": x.id, "name": x.name, "status": x.status, "slots": x.slots, "capabilities": x.capabilities}
            for x in rows]})

    async def runtime_deregister(request: web.Request) -> web.Response:
        return web.json_response(await hub.runtimes.deregister(request[CALLER], request.match_info["name"]))

    def wrap(fn: Callable[[web.Request], Awaitable[web.Response]]) -> Callable:
        async def handler(request: web.Request) -> web.Response:
            try:
                return await fn(request)
            except AmuxError as e:
                return error_response(e, request)
        return handler

    r.add_get("/api/v1/whoami", wrap(whoami))
    r.add_get("/api/v1/profiles", wrap(profiles))
    r.add_post("/api/v1/profiles", wrap(profile_add))
    r.add_get("/api/v1/credentials", wrap(credential_list))
    r.add_put("/api/v1/credentials/{name}", wrap(credential_declare))
    r.add_put("/api/v1/credentials/{name}/{env}", wrap(credential_set))
    r.add_post("/api/v1/tasks/{id}/permission", wrap(permission))
    r.add_get("/api/v1/memory", wrap(memory_list))
    r.add_get("/api/v1/memory/{key}", wrap(memory_get))
    r.add_put("/api/v1/memory/{key}", wrap(memory_put))
    r.add_delete("/api/v1/memory/{key}", wrap(memory_delete))
    r.add_post("/api/v1/sessions", wrap(session_create))
    r.add_get("/api/v1/sessions/{ref}", wrap(session_show))
    r.add_post("/api/v1/sessions/{ref}/turns", wrap(session_send))
    r.add_get("/api/v1/turns/{id}", wrap(turn_get))
    r.add_post("/api/v1/tasks", wrap(submit))
    r.add_get("/api/v1/tasks", wrap(task_list))
    r.add_get("/api/v1/tasks/{id}", wrap(get))
    r.add_get("/api/v1/tasks/{id}/events", wrap(events))
    r.add_get("/api/v1/tasks/{id}/wait", wrap(wait))
    r.add_post("/api/v1/tasks/{id}/cancel", wrap(cancel))
    r.add_get("/api/v1/runtimes", wrap(runtime_list))
    r.add_delete("/api/v1/runtimes/{name}", wrap(runtime_deregister))
    add_token_routes(app, TokenAdmin(hub.auth), wrap)


def add_token_routes(app: web.Application, tokens: TokenAdmin, wrap: Callable) -> None:
    """`GET/POST /api/v1/tokens`, `DELETE /api/v1/tokens/{id}`: your tokens (an admin: anyone's); never a hash."""

    async def token_list(request: web.Request) -> web.Response:
        all_ = request.query.get("all", "").lower() in ("1", "true", "yes")
        return web.json_response({"tokens": await tokens.list(request[CALLER], all_=all_)})

    async def token_create(request: web.Request) -> web.Response:
        data = await _body(request)
        allowed = {"principal", "label", "admin", "runner"}
        if set(data) - allowed:
            raise Invalid(f"unknown fields {sorted(set(data) - allowed)}; a token takes {sorted(allowed)}")
        for key in ("admin", "runner"):
            if not isinstance(data.get(key, False), bool):
                raise Invalid(f"{key} must be true or false")
        for key in ("principal", "label"):
            if not isinstance(data.get(key) or "", str):
                raise Invalid(f"{key} must be a string")
        return web.json_response(await tokens.create(
            request[CALLER], data.get("principal"), label=data.get("label"), admin=data.get("admin", False),
            runner=data.get("runner", False)), status=201)

    async def token_revoke(request: web.Request) -> web.Response:
        return web.json_response(await tokens.revoke(request[CALLER], request.match_info["id"]))

    app.router.add_get("/api/v1/tokens", wrap(token_list))
    app.router.add_post("/api/v1/tokens", wrap(token_create))
    app.router.add_delete("/api/v1/tokens/{id}", wrap(token_revoke))
