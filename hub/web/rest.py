"""`/api/v1`: JSON REST for the CLI and pages; same services as MCP.

Each handler receives a `Call` whose path, query and body were already parsed through the typed models of
`api_models.py` (the same table the OpenAPI spec is built from); refusals are JSON {"error", "fix", "request_id"}.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Awaitable, Callable

from aiohttp import web

from .. import logs
from ..errors import AmuxError, Forbidden, NotFound
from ..services.auth.service import AuthService, TokenAdmin, rest_area, run_token_refusal
from ..services.auth.credentials import CredentialService
from ..services.sessions.memory import MemoryService
from ..services.tasks.profiles import ProfileService
from ..services.tasks.registry import RuntimeRegistry
from ..services.sessions.service import SessionService
from ..services.tasks.service import PermissionService, SubmitRequest, TaskService
from ..services.views import TaskView
from . import api_models as m
from .api_models import CALLER, Call, error_response, flag, register

__all__ = ["CALLER", "error_response", "auth_middleware", "add_routes"]
PUBLIC = ("/api/v1/openapi.json", "/api/v1/docs")


def auth_middleware(auth: AuthService) -> Callable:
    """Authenticate every `/api/` request (the spec and its page are public); 401 names the fix."""

    @web.middleware
    async def middleware(request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        if not request.path.startswith("/api/") or request.path in PUBLIC:
            return await handler(request)
        try:
            caller = await auth.authenticate(request.headers.get("Authorization"))
            logs.note_caller(caller.principal, caller.label)
            refusal = run_token_refusal(caller, rest_area(request.path), read=request.method in ("GET", "HEAD"),
                                        what=f"{request.method} {request.path}")
            if refusal is not None:
                raise Forbidden(refusal)
            request[CALLER] = caller
            return await handler(request)
        except AmuxError as e:
            return error_response(e, request)
        except web.HTTPException as e:  # no such route or method: still the JSON error shape
            if e.status < 400:
                raise
            err = NotFound("no such operation; the operations are listed at /api/v1/openapi.json and /api/v1/docs")
            err.status = e.status
            if e.status != 404:
                err.code = "method_not_allowed" if e.status == 405 else "invalid"
                err.message = f"{request.method} is not an operation of {request.path}; see /api/v1/docs"
            return error_response(err, request)

    return middleware


@dataclass(frozen=True, kw_only=True)
class RestServices:
    """The services the core REST endpoints call."""

    auth: AuthService
    tasks: TaskService
    permissions: PermissionService
    sessions: SessionService
    profiles: ProfileService
    credentials: CredentialService
    memory: MemoryService
    registry: RuntimeRegistry


# Long by design: the REST route table, one short handler per endpoint, reads best as one list.
def add_routes(app: web.Application, hub: RestServices) -> None:
    """Register the REST endpoints over the hub's services."""
    tasks = hub.tasks

    async def whoami(c: Call) -> dict:
        return {"principal": c.caller.principal, "label": c.caller.label, "admin": c.caller.admin}

    async def profiles(_: Call) -> dict:
        return {"profiles": await hub.profiles.list()}

    async def profile_add(c: Call) -> dict:
        return await hub.profiles.add(c.caller, c.body)

    async def credential_list(_: Call) -> dict:
        return {"credential_profiles": await hub.credentials.list()}

    async def credential_declare(c: Call) -> dict:
        return await hub.credentials.declare(c.caller, c.path.name, c.body.env)

    async def credential_set(c: Call) -> dict:
        return await hub.credentials.set_value(c.caller, c.path.name, c.path.env, c.body.value)

    async def session_create(c: Call) -> dict:
        return await hub.sessions.create(c.caller, **c.body.model_dump(exclude_unset=True))

    async def session_show(c: Call) -> dict:
        return await hub.sessions.show(c.caller, await hub.sessions.readable_id(c.caller, c.path.ref))

    async def session_send(c: Call) -> Any:
        sid = await hub.sessions.resolve_ref(c.caller, c.path.ref)
        turn_id = await hub.sessions.submit_turn(c.caller, sid, c.body.text, source="rest")
        if c.body.wait:
            return web.json_response(await hub.sessions.wait_turn(c.caller, turn_id, float(c.body.timeout_s)))
        return {"session_id": sid, "turn_id": turn_id, "status": "queued"}

    async def turn_get(c: Call) -> dict:
        return await hub.sessions.get_turn(c.caller, c.path.id)

    async def memory_list(c: Call) -> dict:
        return await hub.memory.list(c.caller)

    async def memory_get(c: Call) -> dict:
        return await hub.memory.get(c.caller, c.path.key)

    async def memory_put(c: Call) -> dict:
        return await hub.memory.set(c.caller, c.path.key, c.body.value)

    async def memory_delete(c: Call) -> dict:
        return await hub.memory.delete(c.caller, c.path.key)

    async def permission(c: Call) -> dict:
        return await hub.permissions.respond(c.caller, c.path.id, c.body.request_id, c.body.allow, c.body.message or "")

    async def submit(c: Call) -> dict:
        return await tasks.submit(c.caller, SubmitRequest(**c.body.model_dump(exclude_unset=True)))

    async def task_list(c: Call) -> dict:
        return {"tasks": await tasks.list(c.caller, c.query.limit)}

    async def get(c: Call) -> TaskView:
        return await tasks.get(c.caller, c.path.id)

    async def events(c: Call) -> dict:
        return await tasks.events(c.caller, c.path.id, c.query.cursor)

    async def wait(c: Call) -> dict:
        return await tasks.wait(c.caller, c.path.id, c.query.cursor, c.query.timeout_s)

    async def cancel(c: Call) -> dict:
        return await tasks.cancel(c.caller, c.path.id)

    async def runtime_list(_: Call) -> dict:
        return {"runtimes": await hub.registry.list_runtimes()}

    async def runtime_deregister(c: Call) -> dict:
        return await hub.registry.deregister(c.caller, c.path.name)

    for o, fn in ((m.WHOAMI, whoami), (m.PROFILE_LIST, profiles), (m.PROFILE_ADD, profile_add),
                  (m.CREDENTIAL_LIST, credential_list), (m.CREDENTIAL_DECLARE, credential_declare),
                  (m.CREDENTIAL_SET, credential_set), (m.PERMISSION, permission), (m.MEMORY_LIST, memory_list),
                  (m.MEMORY_GET, memory_get), (m.MEMORY_PUT, memory_put), (m.MEMORY_DELETE, memory_delete),
                  (m.SESSION_CREATE, session_create), (m.SESSION_GET, session_show), (m.SESSION_SEND, session_send),
                  (m.TURN_GET, turn_get), (m.TASK_SUBMIT, submit), (m.TASK_LIST, task_list), (m.TASK_GET, get),
                  (m.TASK_EVENTS, events), (m.TASK_WAIT, wait), (m.TASK_CANCEL, cancel),
                  (m.RUNTIME_LIST, runtime_list), (m.RUNTIME_DEREGISTER, runtime_deregister)):
        register(app, o, fn)
    add_token_routes(app, TokenAdmin(hub.auth))


def add_token_routes(app: web.Application, tokens: TokenAdmin) -> None:
    """`GET/POST /api/v1/tokens`, `DELETE /api/v1/tokens/{id}`: your tokens and live OAuth grants (an admin:
    anyone's); never a hash. DELETE takes a token id (tok_…) or a grant id (og_…)."""

    async def token_list(c: Call) -> dict:
        all_ = flag(c.query.all)
        return {"tokens": await tokens.list(c.caller, all_=all_),
                "grants": await tokens.list_grants(c.caller, all_=all_)}

    async def token_create(c: Call) -> dict:
        b = c.body
        return await tokens.create(c.caller, b.principal, label=b.label, admin=b.admin, runner=b.runner)

    async def token_revoke(c: Call) -> dict:
        return await tokens.revoke(c.caller, c.path.id)

    register(app, m.TOKEN_LIST, token_list)
    register(app, m.TOKEN_CREATE, token_create)
    register(app, m.TOKEN_REVOKE, token_revoke)
