"""The HTTP edge: request ids, client addresses, JSON of bounded depth on every route and text every store can keep
(hub/domain/text.py), and no 500 that leaks user content.

A request's id is the operator's `X-Request-Id` when it is well formed (1–128 characters of `A-Z a-z 0-9 . _ : -`),
so a request can be followed from a proxy's log into the hub's; anything else is replaced by a fresh id, and the
value sent is never logged. The id names the request's access line, its `X-Request-Id` answer header, the
`request_id` of every refusal, and every log line written while it is handled (and by the work it starts)."""
from __future__ import annotations

import asyncio
import ipaddress
import json
import logging
import re
import secrets
import traceback
from typing import Awaitable, Callable, Collection
from urllib.parse import unquote

from aiohttp import web

from .server import rearm
from .. import logs
from ..logs import CLIENT, LOG_CONTEXT, REQUEST_ID
from ..domain.durations import duration_text
from ..domain.text import MAX_DEPTH, BadText, check_depth, check_text, check_value, loads

log = logging.getLogger("amux.web")

TEXT_PREFIXES = ("/api/", "/console", "/feishu/")  # routes whose JSON text is checked here; MCP checks its own
REQUEST_ID_HEADER = "X-Request-Id"
WELL_FORMED_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")  # the ids a proxy may hand the hub (README "Configuration")


def request_id_of(sent: str | None) -> str:
    """Return the id a request goes by: the `X-Request-Id` it was sent with when well formed, else a fresh one."""
    if sent is not None and WELL_FORMED_ID.fullmatch(sent):
        return sent
    return secrets.token_hex(8)


def refusal(status: int, error: str, fix: str, request_id: str) -> web.Response:
    """The JSON shape of every refusal made at the edge."""
    return web.json_response({"error": error, "fix": fix, "message": fix, "request_id": request_id}, status=status,
                             headers={REQUEST_ID_HEADER: request_id})


def client_address(peer: str | None, forwarded_for: str | None, trusted: Collection[ipaddress.IPv4Network |
                                                                             ipaddress.IPv6Network]) -> str:
    """Return the client's address: the peer, unless it is a trusted proxy; then the right-most X-Forwarded-For entry
    that is not one (entries left of it could be forged by the client)."""
    hops = [peer or "-"] + [h.strip() for h in reversed((forwarded_for or "").split(",")) if h.strip()]
    for hop in hops:
        try:
            address = ipaddress.ip_address(hop)
        except ValueError:
            return hop[:64]  # not an address (a Unix socket, a garbled header): the last hop that can be told apart
        if not any(address in net for net in trusted):
            return str(address)
    return hops[-1]


def edge_middleware(body_timeout_s: float = 30.0, trusted_proxies: Collection[str] = ()) -> Callable:
    """Give each request its id (the operator's, when well formed) and its client's address; refuse unstorable text
    in its path, query and JSON body, and bodies that arrive slower than `body_timeout_s` (408); turn crashes into
    JSON; give the connection time for its next request."""
    trusted = [ipaddress.ip_network(p, strict=False) for p in trusted_proxies]

    @web.middleware
    async def middleware(request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        rid = request_id_of(request.headers.get(REQUEST_ID_HEADER))
        request[REQUEST_ID] = rid
        request[LOG_CONTEXT], log_token = logs.open_request(rid)
        try:
            return await _handle(request, handler, rid)
        finally:
            logs.close_request(log_token)

    async def _handle(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
                      rid: str) -> web.StreamResponse:
        request[CLIENT] = client_address(request.remote, request.headers.get("X-Forwarded-For") if trusted else None,
                                         trusted)
        try:
            check_text(unquote(request.raw_path, errors="surrogateescape"), "the path")
            for k, v in request.query.items():
                check_text(k, "a query parameter name")
                check_text(v, f"query parameter {k}")
            if request.can_read_body:
                if request.content.is_eof():  # the whole body is here already (most requests): no timer to arm
                    await request.read()  # cached: handlers read the same bytes
                else:
                    await asyncio.wait_for(request.read(), body_timeout_s)
                await _check_body(request, text=request.path.startswith(TEXT_PREFIXES))
        except BadText as e:
            return refusal(400, "invalid", str(e), rid)
        except web.HTTPRequestEntityTooLarge:
            return refusal(413, "too_large", "the request body is too large; send less", rid)
        except asyncio.TimeoutError:
            return refusal(408, "timeout", f"the request body did not arrive within {duration_text(body_timeout_s)} "
                                           "(hub.body_timeout_s); send it at once", rid)
        try:
            response = await handler(request)
        except web.HTTPException:
            raise
        # the one place an unexpected failure is logged, without its message or SQL parameters
        except Exception as e:  # noqa: BLE001 - any failure becomes a logged 500, never a leaked traceback
            frames = "".join(traceback.format_tb(e.__traceback__))
            log.error("request %s %s %s failed: %s\n%s", rid, request.method, request.path, type(e).__name__, frames)
            return refusal(500, "internal", f"the hub failed on this request; retry, and if it persists give the "
                                            f"operator request id {rid}", rid)
        finally:
            rearm(request)
        response.headers.setdefault(REQUEST_ID_HEADER, rid)
        return response

    return middleware


async def _check_body(request: web.Request, *, text: bool) -> None:
    """Refuse a JSON body nested more than MAX_DEPTH levels deep, on every route (a body sent without a JSON type
    is checked only if it parses); with `text`, also refuse invalid JSON and text no store can keep."""
    ctype = request.content_type
    declared = ctype == "application/json" or ctype.endswith("+json")
    if not declared and ctype not in ("application/octet-stream", ""):
        return  # text/plain manifests, forms: their handlers parse them
    raw = await request.read()  # cached: the handler reads the same bytes
    if not raw.strip():
        return
    if declared and text:
        loads(raw)
        return
    try:
        value = json.loads(raw)
    except (ValueError, UnicodeDecodeError):
        return  # not JSON: the handler answers in its own protocol (OAuth, JSON-RPC)
    except RecursionError:
        raise BadText(f"body is nested more than {MAX_DEPTH} levels deep; flatten it") from None
    if text:
        check_value(value)
    else:
        check_depth(value)
