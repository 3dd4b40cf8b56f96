"""Typed requests of `/api/v1`: one model per body, query and path, and the route table the OpenAPI spec is built from.

Every handler runs only after its path, query and body were parsed through these models (`register`), so a
refusal at this edge is the same on every store: strict JSON types, bounded strings and integers, and text
checked by `hub.domain.text.check_text` (no NUL bytes, no unpaired surrogates). Semantic rules (a profile
exists, a rule parses) stay in the services, which name their own fixes.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Annotated, Any, Awaitable, Callable, ClassVar, Literal

from aiohttp import web
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError, to_jsonable_python

from ..domain.pages import MAX_INSTANCES, MAX_SCHEDULES, MAX_SESSIONS, MAX_TASKS
from ..domain.choices import Args, ChoiceChanges, ExecutionChoices, Seconds, TaskChoices
from ..domain.shapes import Clearable, Model, Short, text, validate
from ..domain.text import BadText, check_text, loads
from ..errors import AmuxError, Forbidden, Invalid
from ..services.auth.service import Caller
from ..services.views import (FollowupView, InstanceCreatedView, InstanceListView, InstanceView, InstanceWaitView,
                              InterruptView, MailView, ScheduleView, SteerView, TaskView, View)
from ..logs import REQUEST_ID

CALLER = web.RequestKey("caller", Caller)

MAX_BODY = 1024 * 1024     # a body carrying a prompt or a manifest
SMALL_BODY = 128 * 1024    # every other body (memory and credential values are at most 64 KiB)
INT32 = 2**31 - 1


def _digits(value: Any) -> Any:
    if isinstance(value, str):
        if not value.isascii() or not value.isdigit() or len(value) > 12:
            raise PydanticCustomError("whole_number", "is not a whole number")
        return int(value)
    return value


def _number(value: Any) -> Any:
    if isinstance(value, str):
        try:
            number = float(value)
        except ValueError:
            raise PydanticCustomError("number", "is not a number") from None
        if not math.isfinite(number):
            raise PydanticCustomError("number", "is not a finite number")
        return number
    return value


def query_int(lo: int, hi: int, example: int) -> Any:
    """A query parameter holding a whole number from `lo` to `hi`."""
    # The bounds before the parser, so the spec shows them as `minimum`/`maximum` (after it, pydantic writes `ge`/`le`).
    return Annotated[int, Field(ge=lo, le=hi, description=f"a whole number from {lo} to {hi}, e.g. {example}"),
                     BeforeValidator(_digits)]


Flag = Annotated[Literal["0", "1", "true", "false", "yes", "no"],
                 Field(description='"1"/"true"/"yes" or "0"/"false"/"no"')]
ID = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
Id = text(128, 1, ID, "an identifier such as tr_0a1b2c3d4e")
Ref = text(200, 1, r"^[^/]+$", "an id or a name (1 to 200 characters, no slash)")
Prompt = text(MAX_BODY, description="the text of the work")


class QueryModel(Model):
    """Query parameters arrive as text: numbers are parsed here (lax), everything else is still bounded."""

    model_config = ConfigDict(extra="forbid", strict=False, allow_inf_nan=False)
    what: ClassVar[str] = "this route"


class NoQuery(QueryModel):
    """A route that takes no query parameters."""


def flag(value: str | None) -> bool:
    """Read a Flag query parameter."""
    return value in ("1", "true", "yes")


# --- path parameters -------------------------------------------------------------------------------

class TaskPath(Model):
    id: Id


class SessionPath(Model):
    ref: Ref


class TurnPath(Model):
    id: Id


class InstancePath(Model):
    id: Id


class MemoryPath(Model):
    key: text(200, 1, r"^[^/]+$", "a memory key (1 to 200 characters, no slash)")


CredName = text(64, 1, r"^[a-z0-9][a-z0-9._-]{0,63}$", "a credential profile name, e.g. anthropic")
EnvName = text(128, 1, r"^[A-Z_][A-Z0-9_]{0,127}$", "an environment variable name, e.g. ANTHROPIC_API_KEY")


class CredentialPath(Model):
    name: CredName


class CredentialEnvPath(Model):
    name: CredName
    env: EnvName


class RuntimePath(Model):
    name: Ref


class TokenPath(Model):
    id: Id


class SchedulePath(Model):
    id: Ref


class IdentityPath(Model):
    id: Id


class PrincipalPath(Model):
    ref: Ref


class ExecutionAccess(Model):
    hint: ClassVar[str] = 'send {"revoked": true} to revoke, {"revoked": false} to restore'
    revoked: bool


class ExplainPath(Model):
    ref: Ref


class IncidentPath(Model):
    id: Id
    action: Literal["ack", "snooze", "unsnooze", "pause"]


AckComment = text(1000, description="ack only: what the administrator says with the acknowledgement")
SnoozeSeconds = Annotated[int, Field(gt=0, le=90 * 86400, description="snooze only: seconds to hold reminders, at most "
                                     "90 days (default alerts.snooze_s, the card button's 24 h)")]


class IncidentControl(Model):
    hint: ClassVar[str] = ('send {}, {"comment": "..."} with ack, or {"for_s": 14400} with snooze '
                           '(default: alerts.snooze_s)')
    what: ClassVar[str] = "an incident control"
    comment: AckComment | None = None
    for_s: SnoozeSeconds | None = None


class AppPath(Model):
    app: text(128, 1, r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$", "a Feishu app id, e.g. cli_a1b2c3")


# --- query parameters ------------------------------------------------------------------------------

class TaskListQuery(QueryModel):
    limit: query_int(1, MAX_TASKS, 50) = 50


class SessionListQuery(QueryModel):
    limit: query_int(1, MAX_SESSIONS, 50) = 50


class CursorQuery(QueryModel):
    cursor: query_int(0, INT32, 0) = 0


class TimelineQuery(QueryModel):
    cursor: query_int(0, INT32, 0) = 0
    limit: query_int(1, 1000, 500) = 500


class WaitQuery(QueryModel):
    cursor: query_int(0, INT32, 0) = 0
    timeout_s: Annotated[float, BeforeValidator(_number), Field(ge=0, le=600, description=(
        "seconds to wait for new events, from 0 to 600, e.g. 30"))] = 30.0


class InstanceListQuery(QueryModel):
    limit: query_int(1, MAX_INSTANCES, 50) = 50
    archived: Flag | None = None


class InstanceWaitQuery(QueryModel):
    timeout_s: Annotated[float, BeforeValidator(_number), Field(ge=0, le=600, description=(
        "seconds to wait for the current run, from 0 to 600, e.g. 30 (a timeout never cancels it)"))] = 30.0


class AllQuery(QueryModel):
    all: Flag | None = None


class ScheduleListQuery(QueryModel):
    limit: query_int(1, MAX_SCHEDULES, 100) = 100
    all: Flag | None = None


class HistoryQuery(QueryModel):
    cursor: query_int(0, INT32, 0) = 0
    limit: query_int(0, INT32, 50) = 50


# --- bodies ----------------------------------------------------------------------------------------

class TaskSubmit(TaskChoices):
    """A Task to run (omitted choices are resolved at admission)."""

    hint: ClassVar[str] = 'send {"prompt": "...", "profile": "scripted"}'
    what: ClassVar[str] = "a task"
    prompt: Prompt
    name: Short | None = None


class SessionCreate(Model):
    """A Session: its engine, model and effort are resolved like a Task's."""

    hint: ClassVar[str] = 'send {"name": "...", "profile": "..."}'
    what: ClassVar[str] = "a session"
    name: Short | None = None
    profile: Short | None = None
    model: Short | None = None
    reasoning_effort: Short | None = None
    runtime: Short | None = None
    permission_policy: Short | None = None
    extra_args: Args | None = None


class TurnSend(Model):
    """A prompt for a Session; `wait` blocks up to `timeout_s` for its outcome."""

    hint: ClassVar[str] = ('send {"text": "...", "wait": false}; '
                           'timeout_s is a number of seconds from 1 to 3600, e.g. 600')
    what: ClassVar[str] = "a turn"
    text: Prompt
    wait: bool = False
    timeout_s: Annotated[float, Field(gt=0, le=3600, description="seconds from 1 to 3600, e.g. 600")] = 600


class InstanceCreate(Model):
    """An Agent Instance: identity and permission policy frozen now; `prompt` starts its first run."""

    hint: ClassVar[str] = 'send {"profile": "scripted", "name": "...", "prompt": "optional first prompt"}'
    what: ClassVar[str] = "an instance"
    name: Short | None = None
    profile: Short | None = None
    model: Short | None = None
    reasoning_effort: Short | None = None
    runtime: Short | None = None
    permission_policy: Short | None = None
    extra_args: Args | None = None
    prompt: Prompt | None = None
    timeout_s: Seconds | None = None


class InstanceFollowup(Model):
    """Work for an instance's next owner TaskRun; omitted identity keeps the saved one, a change is refused."""

    hint: ClassVar[str] = 'send {"prompt": "..."}'
    what: ClassVar[str] = "a followup"
    prompt: Prompt
    profile: Short | None = None
    engine: Short | None = None
    model: Short | None = None
    runtime: Short | None = None
    permission_policy: Short | None = None
    timeout_s: Seconds | None = None


class InstanceText(Model):
    """Text for an instance: mailbox input, or a correction for its running turn."""

    hint: ClassVar[str] = 'send {"text": "..."}'
    what: ClassVar[str] = "a message"
    text: Prompt


class MemoryPut(Model):
    hint: ClassVar[str] = 'send {"value": "..."}'
    what: ClassVar[str] = "a memory entry"
    value: text(64 * 1024, description="text of at most 64 KiB")


class PermissionAnswer(Model):
    hint: ClassVar[str] = 'send {"request_id": "...", "allow": true|false, "message": "optional"}'
    what: ClassVar[str] = "a permission answer"
    request_id: Short
    allow: bool
    message: text(4000) | None = None


class CredentialDeclare(Model):
    hint: ClassVar[str] = 'send {"env": ["VAR", ...]}'
    what: ClassVar[str] = "a credential profile"
    env: Annotated[list[EnvName], Field(min_length=1, max_length=64)]


class CredentialSet(Model):
    hint: ClassVar[str] = 'send {"value": "..."}'
    what: ClassVar[str] = "a credential value"
    value: text(64 * 1024, description="the secret value")


class TokenCreate(Model):
    hint: ClassVar[str] = 'send {"principal": "alice", "label": "laptop", "admin": false, "runner": false}'
    what: ClassVar[str] = "a token"
    principal: Short | None = None
    label: Short | None = None
    admin: bool = False
    runner: bool = False


class ScheduleFields(ExecutionChoices):
    """The fields of a schedule: its definition and the execution choices of each Task it submits."""

    hint: ClassVar[str] = 'send {"name": "...", "prompt": "...", "rule": "every 1h"}'
    what: ClassVar[str] = "a schedule"
    name: Short | None = None
    prompt: Prompt | None = None
    rule: text(500) | None = None
    timezone: text(64) | None = None
    schedule_type: Literal["subtask", "session-prompt"] | None = None
    session_ref: Short | None = None
    notify: Literal["failures", "all", "none"] | None = None
    overlap: Literal["allow", "skip", "replace"] | None = None


class ScheduleUpdate(ChoiceChanges, ScheduleFields):
    """The fields to change; omitted ones are kept, and "" clears an execution choice (as schedule_update does)."""

    session_ref: Clearable | None = None


class ScheduleCreate(ScheduleFields):
    source: Literal["rest", "cli"] = "rest"


def error_response(e: AmuxError, request: web.Request | None = None) -> web.Response:
    """Render a refusal as JSON with its status: `error` (code), `fix` (what to do; also as `message`), `request_id`."""
    body = {"error": e.code, "fix": e.message, "message": e.message}
    if request is not None and REQUEST_ID in request:
        body["request_id"] = request[REQUEST_ID]
    return web.json_response(body, status=e.status)


# --- answers (documented in the spec and checked by the fuzzing; more keys may be present) ---------------

class Reply(BaseModel):
    """An answer's guaranteed keys; the hub may add others."""

    model_config = ConfigDict(extra="allow")


class WhoamiReply(Reply):
    principal: str
    label: str | None
    admin: bool


class TaskStatusReply(Reply):
    task_id: str
    status: str


class TaskListReply(Reply):
    tasks: list[TaskStatusReply]


class EventsReply(Reply):
    events: list[dict[str, Any]]
    cursor: int
    done: bool


class TimelineReply(Reply):
    """A run's Agent Timeline: raw agent events (tool input and output, diffs, locations, text), secrets cut."""

    events: list[dict[str, Any]] = Field(description="each with `seq` (the runner's sequence), `type`, `at` and "
                                         "the event's raw fields (`tool` with input/output/diff/locations, `text`)")
    cursor: int
    done: bool
    retention_s: float = Field(description="events older than this many seconds are swept (timeline.retention_s)")


class SessionReply(Reply):
    session_id: str
    name: str | None


class SessionSummaryReply(Reply):
    session_id: str
    name: str | None
    kind: str
    engine: str


class SessionListReply(Reply):
    sessions: list[SessionSummaryReply]


class ScheduleListReply(Reply):
    schedules: list[ScheduleView]


class TokenReply(Reply):
    id: str
    kind: str


class GrantReply(Reply):
    id: str
    client: str
    scopes: list[str]
    approved_by: str | None
    created: str


class TokenListReply(Reply):
    tokens: list[TokenReply]
    grants: list[GrantReply]


class RuntimeListReply(Reply):
    runtimes: list[dict[str, Any]]


# --- parsing ---------------------------------------------------------------------------------------

def _too_large(limit: int) -> TooLarge:
    return TooLarge(f"the request body is larger than {limit} bytes, this operation's limit; send less")


async def _read(request: web.Request, limit: int) -> bytes:
    if request.content_length and request.content_length > limit:
        raise _too_large(limit)
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise _too_large(limit) from None
    if len(raw) > limit:
        raise _too_large(limit)
    return raw


async def parse(request: web.Request, model: type[Model], limit: int = MAX_BODY) -> Any:
    """Read and validate the JSON object body of `request` (an empty body is `{}`), at most `limit` bytes."""
    try:
        data = loads(await _read(request, limit) or b"{}")
    except BadText as e:
        raise Invalid(str(e)) from e
    if not isinstance(data, dict):
        raise Invalid(f"request body must be a JSON object; {model.hint}".rstrip("; "))
    return validate(model, data, "body")


async def parse_text(request: web.Request, limit: int = MAX_BODY) -> str:
    """Read a text body (a profile manifest): bounded, storable."""
    body = (await _read(request, limit)).decode(errors="replace")
    try:
        check_text(body, "the body")
    except BadText as e:
        raise Invalid(str(e)) from e
    return body


class TooLarge(AmuxError):
    """The body is past the route's limit."""

    status = 413
    code = "too_large"


def wire(result: Any) -> Any:
    """Return a handler's answer as JSON values: a service's view as its wire form, also inside lists and objects."""
    if isinstance(result, View):
        return result.wire()
    return to_jsonable_python(result, by_alias=True)


# --- the route table -------------------------------------------------------------------------------

@dataclass
class Call:
    """What a handler receives: the parsed path, query and body (None when the route takes none)."""

    request: web.Request
    path: Any = None
    query: Any = None
    body: Any = None

    @property
    def caller(self) -> Caller:
        """The authenticated caller."""
        return self.request[CALLER]


ERRORS = (400, 401, 403, 404, 409, 413, 429, 500)


@dataclass(frozen=True)
class Op:
    """One `/api/v1` operation: its inputs and answers (the OpenAPI spec is built from these)."""

    method: str
    path: str
    id: str
    summary: str
    path_model: type[Model] | None = None
    query: type[QueryModel] = NoQuery
    body: type[Model] | None = None
    text_body: bool = False
    max_body: int = SMALL_BODY   # bytes; operations that carry a prompt or a manifest take MAX_BODY
    ok: tuple[int, ...] = (200,)
    admin: str | None = None   # the 403 fix when a non-admin calls an admin-only operation
    tag: str = "tasks"
    reply: type[BaseModel] | None = None   # the success answer's keys: a Reply, or a service's View (None: an object)


Handler = Callable[[Call], Awaitable[Any]]
OPS: list[Op] = []


def op(*args: Any, **kwargs: Any) -> Op:
    """Declare an operation in the route table."""
    o = Op(*args, **kwargs)
    OPS.append(o)
    return o


def register(app: web.Application, o: Op, fn: Handler) -> None:
    """Add `o` to the router: admin gate, then path, query and body parsing, then `fn`; refusals as JSON."""
    async def handler(request: web.Request) -> web.StreamResponse:
        try:
            if o.admin and not request[CALLER].admin:
                raise Forbidden(o.admin)
            call = Call(request)
            if o.path_model is not None:
                call.path = validate(o.path_model, dict(request.match_info), "path")
            call.query = validate(o.query, {k: request.query.getall(k)[-1] for k in request.query}, "query")
            if o.body is not None:
                call.body = await parse(request, o.body, o.max_body)
            elif o.text_body:
                call.body = await parse_text(request, o.max_body)
            result = await fn(call)
        except AmuxError as e:
            return error_response(e, request)
        if isinstance(result, web.StreamResponse):
            return result
        return web.json_response(wire(result), status=o.ok[0])

    app.router.add_route(o.method, o.path, handler, name=o.id)


# Declared in one place so the spec, the router and the CLI check agree. Handlers live in rest.py & co.
S, A, IDENT, INST = "schedules", "alerts", "identity", "instances"
PROFILE_ADMIN = "adding profiles needs an admin token (amux token create --admin)"
CRED_ADMIN = ("declaring credential profiles needs an admin token; ask an operator, who makes one with "
              "`amux token create --principal NAME --admin`")
ALERT_ADMIN = "the alert center needs an admin token; create one with `amux token create --admin`"

WHOAMI = op("GET", "/api/v1/whoami", "whoami", "Who the token belongs to", tag="tokens", reply=WhoamiReply)
PROFILE_LIST = op("GET", "/api/v1/profiles", "profile_list", "List launch profiles", tag="profiles")
PROFILE_ADD = op("POST", "/api/v1/profiles", "profile_add", "Store a v2 profile manifest (TOML text)", text_body=True,
                 ok=(201,), admin=PROFILE_ADMIN, tag="profiles", max_body=MAX_BODY)
CREDENTIAL_LIST = op("GET", "/api/v1/credentials", "credential_list", "List credential profiles", tag="credentials")
CREDENTIAL_DECLARE = op("PUT", "/api/v1/credentials/{name}", "credential_declare", "Declare a credential profile",
                        CredentialPath, body=CredentialDeclare, ok=(201,), admin=CRED_ADMIN, tag="credentials")
CREDENTIAL_SET = op("PUT", "/api/v1/credentials/{name}/{env}", "credential_set", "Store your value for one variable",
                    CredentialEnvPath, body=CredentialSet, tag="credentials")
PERMISSION = op("POST", "/api/v1/tasks/{id}/permission", "permission_respond", "Answer a task's permission request",
                TaskPath, body=PermissionAnswer)
MEMORY_LIST = op("GET", "/api/v1/memory", "memory_list", "List memory keys", tag="memory")
MEMORY_GET = op("GET", "/api/v1/memory/{key}", "memory_get", "Read a memory entry", MemoryPath, tag="memory")
MEMORY_PUT = op("PUT", "/api/v1/memory/{key}", "memory_put", "Store a memory entry", MemoryPath, body=MemoryPut,
                tag="memory")
MEMORY_DELETE = op("DELETE", "/api/v1/memory/{key}", "memory_delete", "Delete a memory entry", MemoryPath, tag="memory")
SESSION_CREATE = op("POST", "/api/v1/sessions", "session_create", "Create a session", body=SessionCreate, ok=(201,),
                    tag="sessions", reply=SessionReply)
SESSION_GET = op("GET", "/api/v1/sessions/{ref}", "session_get", "Show a session and its turns", SessionPath,
                 tag="sessions", reply=SessionReply)
SESSION_SEND = op("POST", "/api/v1/sessions/{ref}/turns", "session_send",
                  "Send a prompt (201 queued; 200 with the outcome when wait is true)", SessionPath, body=TurnSend,
                  ok=(201, 200), tag="sessions", max_body=MAX_BODY)
TURN_GET = op("GET", "/api/v1/turns/{id}", "turn_get", "Show a turn", TurnPath, tag="sessions")
TASK_SUBMIT = op("POST", "/api/v1/tasks", "task_submit", "Submit a task", body=TaskSubmit, ok=(201,),
                 reply=TaskStatusReply, max_body=MAX_BODY)
TASK_LIST = op("GET", "/api/v1/tasks", "task_list", "List your tasks", query=TaskListQuery,
                reply=TaskListReply)
TASK_GET = op("GET", "/api/v1/tasks/{id}", "task_get", "Show a task", TaskPath, reply=TaskView)
TASK_EVENTS = op("GET", "/api/v1/tasks/{id}/events", "task_events", "Read a task's events after a cursor", TaskPath,
                 query=CursorQuery, reply=EventsReply)
TASK_WAIT = op("GET", "/api/v1/tasks/{id}/wait", "task_wait", "Wait for a task's events after a cursor", TaskPath,
               query=WaitQuery, reply=EventsReply)
TASK_CANCEL = op("POST", "/api/v1/tasks/{id}/cancel", "task_cancel", "Cancel a task", TaskPath, reply=TaskStatusReply)
RUNTIME_LIST = op("GET", "/api/v1/runtimes", "runtime_list", "List runtimes", tag="runtimes",
                  reply=RuntimeListReply)
RUNTIME_DEREGISTER = op("DELETE", "/api/v1/runtimes/{name}", "runtime_deregister",
                        "Free a runtime name and its runner-token binding (yours; an admin: any)",
                        RuntimePath, tag="runtimes")
TOKEN_LIST = op("GET", "/api/v1/tokens", "token_list",
                "List your tokens and live OAuth grants (all=1: everyone's, admin)", query=AllQuery,
                tag="tokens", reply=TokenListReply)
TOKEN_CREATE = op("POST", "/api/v1/tokens", "token_create", "Create a token", body=TokenCreate, ok=(201,), tag="tokens",
                  reply=TokenReply)
TOKEN_REVOKE = op("DELETE", "/api/v1/tokens/{id}", "token_revoke",
                  "Revoke a token (and the OAuth grants it approved) or a grant (og_…)", TokenPath, tag="tokens")
SCHEDULE_CREATE = op("POST", "/api/v1/schedules", "schedule_create", "Create a schedule", body=ScheduleCreate,
                     ok=(201,), tag=S, reply=ScheduleView, max_body=MAX_BODY)
SCHEDULE_LIST = op("GET", "/api/v1/schedules", "schedule_list", "List schedules", query=ScheduleListQuery, tag=S,
                   reply=ScheduleListReply)
SCHEDULE_GET = op("GET", "/api/v1/schedules/{id}", "schedule_get", "Show a schedule", SchedulePath, tag=S,
                   reply=ScheduleView)
SCHEDULE_UPDATE = op("PATCH", "/api/v1/schedules/{id}", "schedule_update", "Change a schedule", SchedulePath,
                     body=ScheduleUpdate, tag=S, reply=ScheduleView, max_body=MAX_BODY)
SCHEDULE_PAUSE = op("POST", "/api/v1/schedules/{id}/pause", "schedule_pause", "Pause a schedule", SchedulePath, tag=S,
                     reply=ScheduleView)
SCHEDULE_RESUME = op("POST", "/api/v1/schedules/{id}/resume", "schedule_resume", "Resume a schedule", SchedulePath,
                     tag=S, reply=ScheduleView)
SCHEDULE_RUN_NOW = op("POST", "/api/v1/schedules/{id}/run-now", "schedule_run_now",
                      "Fire a schedule once now (a manual firing; the next fire time stays)", SchedulePath, tag=S)
SCHEDULE_DELETE = op("DELETE", "/api/v1/schedules/{id}", "schedule_delete", "Delete a schedule", SchedulePath, tag=S)
SCHEDULE_HISTORY = op("GET", "/api/v1/schedules/{id}/history", "schedule_history", "A schedule's firings",
                      SchedulePath, query=HistoryQuery, tag=S)
ALERT_LIST = op("GET", "/api/v1/alerts", "alert_list", "Open incidents and delivery diagnostics (all=1: closed too)",
                query=AllQuery, admin=ALERT_ADMIN, tag=A)
ALERT_EXPLAIN = op("GET", "/api/v1/alerts/explain/{ref}", "alert_explain", "The decision log of an incident or firing",
                   ExplainPath, admin=ALERT_ADMIN, tag=A)
ALERT_CONTROL = op("POST", "/api/v1/alerts/incidents/{id}/{action}", "alert_control",
                   "Acknowledge (optional comment), snooze (optional for_s), unsnooze or pause an incident",
                   IncidentPath, body=IncidentControl, admin=ALERT_ADMIN, tag=A)
FEISHU_RECHECK = op("POST", "/api/v1/feishu/apps/{app}/recheck", "feishu_recheck",
                    "Lift a delivery suspension of a Feishu app", AppPath, admin=ALERT_ADMIN, tag=A)
LINK_CODE = op("POST", "/api/v1/identity/link-codes", "identity_link_code", "Create a one-time link code", ok=(201,),
               tag=IDENT)
IDENTITY_LIST = op("GET", "/api/v1/identities", "identity_list", "List identity bindings (all=1: everyone's, admin)",
                   query=AllQuery, tag=IDENT)
IDENTITY_UNLINK = op("DELETE", "/api/v1/identities/{id}", "identity_unlink", "Unlink an identity binding",
                     IdentityPath, tag=IDENT)
EXECUTION_ACCESS = op("PUT", "/api/v1/principals/{ref}/execution", "principal_execution",
                      "Revoke or restore a principal's execution access (admin)", PrincipalPath, body=ExecutionAccess,
                      admin="changing execution access needs an admin token (amux token create --admin)", tag=IDENT)
SESSION_LIST = op("GET", "/api/v1/sessions", "session_list", "List your sessions, most recently updated first",
                  query=SessionListQuery, tag="sessions", reply=SessionListReply)
INSTANCE_CREATE = op("POST", "/api/v1/instances", "instance_create", "Create an Agent Instance (prompt: its first run)",
                     body=InstanceCreate, ok=(201,), tag=INST, reply=InstanceCreatedView, max_body=MAX_BODY)
INSTANCE_LIST = op("GET", "/api/v1/instances", "instance_list",
                   "List your Agent Instances, newest first (archived=1: archived ones too)", query=InstanceListQuery,
                   tag=INST, reply=InstanceListView)
INSTANCE_GET = op("GET", "/api/v1/instances/{id}", "instance_get", "Show an instance", InstancePath, tag=INST,
                  reply=InstanceView)
INSTANCE_FOLLOWUP = op("POST", "/api/v1/instances/{id}/followups", "instance_followup",
                       "Submit work as the instance's next owner TaskRun", InstancePath, body=InstanceFollowup,
                       ok=(201,), tag=INST, reply=FollowupView, max_body=MAX_BODY)
INSTANCE_SEND = op("POST", "/api/v1/instances/{id}/messages", "instance_send",
                   "Queue mailbox input for the instance's next run", InstancePath, body=InstanceText, ok=(201,),
                   tag=INST, reply=MailView, max_body=MAX_BODY)
INSTANCE_STEER = op("POST", "/api/v1/instances/{id}/steer", "instance_steer",
                    "Correct the running turn (delivered), else queue it (queued); unknown delivery queues nothing",
                    InstancePath, body=InstanceText, tag=INST, reply=SteerView, max_body=MAX_BODY)
INSTANCE_INTERRUPT = op("POST", "/api/v1/instances/{id}/interrupt", "instance_interrupt",
                        "Cancel the instance's current run; the instance stays", InstancePath, tag=INST,
                        reply=InterruptView)
INSTANCE_WAIT = op("GET", "/api/v1/instances/{id}/wait", "instance_wait",
                   "Wait for the instance's current run (a timeout never cancels it)", InstancePath,
                   query=InstanceWaitQuery, tag=INST, reply=InstanceWaitView)
INSTANCE_ARCHIVE = op("POST", "/api/v1/instances/{id}/archive", "instance_archive", "Archive an idle instance",
                      InstancePath, tag=INST, reply=InstanceView)
TASK_TIMELINE = op("GET", "/api/v1/tasks/{id}/timeline", "task_timeline",
                   "Read a task's Agent Timeline (raw tool input/output, diffs, text; owner and admins)", TaskPath,
                   query=TimelineQuery, reply=TimelineReply)
TURN_TIMELINE = op("GET", "/api/v1/turns/{id}/timeline", "turn_timeline",
                   "Read a turn's Agent Timeline (raw tool input/output, diffs, text; owner and admins)", TurnPath,
                   query=TimelineQuery, tag="sessions", reply=TimelineReply)
