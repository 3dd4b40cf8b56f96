"""Build the MCPServer with amux's tools; authentication happens at the HTTP door."""
from __future__ import annotations

import difflib
import logging
from typing import Any, Awaitable, Callable

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import CLIENT_INFO_META_KEY, Tool as MCPTool
from mcp_types.methods import serialize_server_result

from ..errors import AmuxError
from ..ids import new_id
from ..store.db import is_unavailable, unavailable_text
from ..domain.text import BadText, check_value
from ..services.auth.service import ALL_SCOPES, Caller, run_token_refusal
from .client_sessions import clean_name, labeled

log = logging.getLogger("amux.mcp")

INSTRUCTIONS = (
    "amux hub: delegate bounded coding-agent work as Tasks (task_submit, task_wait, task_get). "
    "Use profile 'scripted' for deterministic demos; its prompt is a script (say/tool/usage/write/sleep/ask/fail)."
)


def caller_of(ctx: Context) -> Caller:
    """Return the Caller the HTTP door authenticated for this request."""
    request = ctx.request_context.request
    state = getattr(request, "scope", {}).get("state") or {}
    caller = state.get("caller")
    if caller is None:
        raise ToolError("not authenticated: send `Authorization: Bearer <token>`; "
                        "create one with `amux token create --principal NAME`")
    return caller


TOOL_SCOPES = (("schedule_", "schedules"), ("rift_", "leases"), ("task_", "tasks"), ("instance_", "tasks"),
               ("profile_", "tasks"), ("permission_", "tasks"), ("session_", "tasks"))


def scope_refusal(caller: Caller | None, tool: str) -> str | None:
    """Return the refusal of a tool call outside the OAuth scopes granted to the caller (amux tokens carry every
    scope), or None.

    One check for every call instead of one per tool, so a tool added later is covered: a tool of no known group
    needs every scope.
    """
    needed = {scope for prefix, scope in TOOL_SCOPES if tool.startswith(prefix)} or set(ALL_SCOPES)
    if caller is None or needed <= caller.scopes:
        return None
    missing = " ".join(sorted(needed - caller.scopes))
    return (f"{tool}: this connection was not granted the `{missing}` scope; reconnect the hub in your MCP "
            f"client and allow `{missing}` on the hub's approval page")


# The REST area of each tool group (`/api/v1/<area>`), so a run token reaches the same things on both doors.
TOOL_AREAS = (("schedule_", "schedules"), ("rift_", "leases"), ("task_", "tasks"), ("instance_", "instances"),
              ("profile_", "profiles"), ("permission_", "tasks"), ("session_", "sessions"))
READ_TOOLS = ("_list", "_get", "_wait", "_events", "_history", "_timeline")


def run_tool_refusal(caller: Caller | None, tool: str) -> str | None:
    """Return the refusal of a run token's tool call outside memory and coordination (the REST rule), or None."""
    if caller is None:
        return None
    area = next((a for prefix, a in TOOL_AREAS if tool.startswith(prefix)), "")
    refusal = run_token_refusal(caller, area, read=tool.endswith(READ_TOOLS), what=f"the {tool} tool")
    return f"{tool}: {refusal}" if refusal else None


def tool_refusal(ctx: Any, text: str) -> Any:
    """Answer a tools/call from middleware with a tool error (a middleware owns the wire shape per version)."""
    refusal = {"content": [{"type": "text", "text": text}], "isError": True, "resultType": "complete"}
    return serialize_server_result("tools/call", ctx.protocol_version, refusal)


def argument_refusal(params: dict[str, Any]) -> str | None:
    """Return the refusal of tool arguments no store can keep (NUL bytes, unpaired surrogates, deep nesting), naming
    the field, or None.

    The same check as the REST edge (hub/web/edge.py), so both stores and both doors answer alike.
    """
    try:
        check_value(params.get("arguments") or {}, "argument")
    except BadText as e:
        return f"{params.get('name', 'tool')}: {e}"
    return None


def capture_client(state: dict[str, Any], method: str, params: dict[str, Any] | None) -> None:
    """Name the caller after the client that declares its name in this request (`initialize`, or a 2026 request's
    `_meta`); at `initialize` the door answers with a session id carrying the name for the requests that follow."""
    name = client_name(method, params)
    name = clean_name(name) if name else None
    if name:
        state["declared"] = name if method == "initialize" else None
        state["caller"] = labeled(state["token_caller"], name)


def unknown_argument_refusal(tool: str, arguments: Any, known: tuple[str, ...]) -> str | None:
    """Return the refusal of arguments `tool` does not take, naming the nearest valid one and all of them, or None.

    REST refuses an unknown field (`unknown fields [...]; a task takes [...]`); the SDK would drop it and apply the
    default, which for a misspelt `permission_policy` is the least safe choice.
    """
    unknown = [str(name) for name in arguments if name not in known] if isinstance(arguments, dict) else []
    if not unknown:
        return None
    takes = ", ".join(known) or "no arguments"
    near = {name: difflib.get_close_matches(name, known, n=1) for name in unknown}
    if len(unknown) == 1:
        name = unknown[0]
        hint = f"; did you mean {near[name][0]!r}? It takes: " if near[name] else "; it takes: "
        return f"{tool} has no argument {name!r}{hint}{takes}"
    named = ", ".join(f"{n!r}" + (f" (did you mean {near[n][0]!r}?)" if near[n] else "") for n in unknown)
    return f"{tool} has no arguments {named}; it takes: {takes}"


def closed_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Return a tool's input schema saying that it takes no argument beyond its properties."""
    return {**schema, "additionalProperties": False}


class AmuxMCPServer(MCPServer):
    """The SDK's MCPServer publishing every tool's input schema closed (`additionalProperties: false`) and its output
    schema compact (`compact_schema`).

    `list_tools` is the SDK's public listing (its `tools/list` handler calls it); it is built once after the tools
    change. The guard reads the arguments each tool takes from the same listing, so what is published and what is
    refused cannot drift apart. Results are still validated by the SDK against each tool's return model, which the
    compact output schema does not touch.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._listing: list[MCPTool] | None = None
        self._arguments: dict[str, tuple[str, ...]] | None = None
        self.middleware.append(self.request_guard)

    async def list_tools(self) -> list[MCPTool]:
        """List all tools, each input schema closed to arguments it does not declare, each output schema compact."""
        if self._listing is None:
            self._listing = [t.model_copy(update={
                "input_schema": closed_schema(t.input_schema),
                "output_schema": None if t.output_schema is None else compact_schema(dict(t.output_schema))})
                for t in await super().list_tools()]
        return list(self._listing)

    def add_tool(self, *args: Any, **kwargs: Any) -> None:
        """Register a tool (the SDK's), forgetting the listing built so far."""
        super().add_tool(*args, **kwargs)
        self._listing = self._arguments = None

    def remove_tool(self, name: str) -> None:
        """Remove a tool (the SDK's), forgetting the listing built so far."""
        super().remove_tool(name)
        self._listing = self._arguments = None

    async def arguments_of(self, tool: str) -> tuple[str, ...] | None:
        """Return the argument names `tool` takes, or None for a tool that does not exist.

        Read from the listing once after the tools change (not per call: a call naming no tool costs a lookup).
        """
        if self._arguments is None:
            self._arguments = {t.name: tuple(t.input_schema.get("properties") or {}) for t in await self.list_tools()}
        return self._arguments.get(tool)

    async def request_guard(self, ctx: Any, call_next: Callable[[Any], Awaitable[Any]]) -> Any:
        """Every request's middleware (one layer, not three): capture the client's name, then refuse a tool call
        outside the caller's scopes, outside what a run token may reach, with arguments no store can keep, or with an
        argument the tool does not take (nothing runs, nothing is stored).

        The HTTP door put the caller (and the client its session id names) in the request state.
        """
        state = getattr(ctx.request, "scope", {}).get("state")
        method = ctx.method
        params = ctx.params if isinstance(ctx.params, dict) else dict(ctx.params or {})
        if state is not None and state.get("token_caller") is not None:
            capture_client(state, method, params or None)
        if method == "tools/call":
            caller, tool = (state or {}).get("caller"), str(params.get("name", ""))
            refusal = run_tool_refusal(caller, tool) or scope_refusal(caller, tool) or argument_refusal(params)
            if refusal is None and (known := await self.arguments_of(tool)) is not None:
                refusal = unknown_argument_refusal(tool, params.get("arguments") or {}, known)
            if refusal is not None:
                return tool_refusal(ctx, refusal)
        return await call_next(ctx)


async def guarded(fn: Callable[[], Awaitable[Any]]) -> Any:
    """Turn our refusals into tool errors the client sees as text."""
    try:
        return await fn()
    except AmuxError as e:
        raise ToolError(e.message) from e
    except Exception as e:
        if not is_unavailable(e):
            raise
        rid = new_id("req")
        log.warning("tool call failed on the database (%s: %s); answered retry, request id %s", type(e).__name__,
                    str(e)[:200], rid)
        raise ToolError(unavailable_text(rid)) from e


def client_name(method: str, params: Any) -> str | None:
    """Find the client's declared name at `initialize` or in a 2026 request's `_meta`."""
    if not isinstance(params, dict):
        return None
    info = params.get("clientInfo") if method == "initialize" else None
    if info is None:
        meta = params.get("_meta")
        info = meta.get(CLIENT_INFO_META_KEY) if isinstance(meta, dict) else None
    name = info.get("name") if isinstance(info, dict) else None
    return name if isinstance(name, str) else None


# Keywords that constrain only instances of one JSON type: under `type: [T, "null"]` they leave `null` alone, as the
# `anyOf` branch they come from did.
_ONLY_FOR = {
    "object": {"properties", "additionalProperties", "required", "patternProperties", "propertyNames",
               "minProperties", "maxProperties"},
    "array": {"items", "prefixItems", "minItems", "maxItems", "uniqueItems", "contains"},
    "string": {"minLength", "maxLength", "pattern", "format"},
    "integer": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
    "boolean": set(),
}
_ANNOTATIONS = {"title", "description"}
_NULL = {"type": "null"}


def compact_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """Return an output schema that validates the same instances, in the form a client checks fastest.

    Every local `$ref` is replaced by its definition (no `$defs` left), and `anyOf: [S, {type: null}]` with S one
    JSON type and keywords only for that type is written `type: [T, "null"]` with S's keywords. A client that
    validates each result against the schema (the Python SDK runs jsonschema on every call) then descends once
    per value, not through a reference and two branches (docs/performance.md). A schema whose definitions refer to
    themselves is returned unchanged.
    """
    defs = schema.get("$defs", {})

    def walk(node: Any, seen: tuple[str, ...]) -> Any:
        if isinstance(node, list):
            return [walk(v, seen) for v in node]
        if not isinstance(node, dict):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            name = ref.rsplit("/", 1)[1]
            if name in seen or name not in defs:
                raise _Recursive
            node = {**walk(defs[name], (*seen, name)), **{k: v for k, v in node.items() if k != "$ref"}}
        out = {k: walk(v, seen) for k, v in node.items() if k != "$defs"}
        return _nullable(out)

    try:
        return walk(schema, ())
    except _Recursive:
        return schema


class _Recursive(Exception):
    """A definition that refers to itself (cannot be inlined)."""


def _nullable(node: dict[str, Any]) -> dict[str, Any]:
    """Write `anyOf: [S, {type: null}]` as `type: [T, "null"]` when S is one type T with keywords only for T."""
    branches = node.get("anyOf")
    if not isinstance(branches, list) or len(branches) != 2 or _NULL not in branches:
        return node
    other = branches[1] if branches[0] == _NULL else branches[0]
    kind = other.get("type") if isinstance(other, dict) else None
    if not isinstance(kind, str) or kind not in _ONLY_FOR:
        return node
    rest = {k: v for k, v in other.items() if k != "type"}
    if any(k not in _ONLY_FOR[kind] | _ANNOTATIONS for k in rest) or "type" in node:
        return node
    out = {k: v for k, v in node.items() if k != "anyOf"}
    out.update({k: v for k, v in rest.items() if k not in out})  # the field's own title/description win
    out["type"] = [kind, "null"]
    return out


def build_mcp(registrars: list[Callable[[MCPServer], None]]) -> MCPServer:
    """Create the MCP server: client-name capture plus each feature's tools."""
    server = AmuxMCPServer("amux", instructions=INSTRUCTIONS, version="0.1.0")
    for register in registrars:
        register(server)
    return server
