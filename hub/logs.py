"""Logs (README "Configuration"): text or JSON lines on stderr, configured once at start by the CLI entry points.

Every line written while a request is handled carries its `request_id` and, once the request is authenticated,
its principal and client label (the token's label); the edge middleware (hub/web/edge.py) opens that context.
`AccessLog` writes one line per HTTP request on `amux.access`. Secrets never reach a line: amux tokens and lease
handles are cut to their ids, and the configured secret values (hub/config_sources.py SECRETS) are masked.
"""
from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import re
import sys
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, TextIO

from aiohttp import web
from aiohttp.abc import AbstractAccessLogger
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse

from .config import LogSettings

ACCESS = "amux.access"
FIELDS = ("request_id", "principal", "client")  # the request context every line carries (null outside one)
EXTRAS = ("method", "path", "status", "duration_ms", "remote", "loop")  # structured fields some lines add
# `amux.<id>.<secret>` tokens and `task_<id>.<secret>` lease handles: the id stays, the secret goes
_TOKEN = re.compile(r"\b(amux\.[A-Za-z0-9_-]+\.|task_[A-Za-z0-9]+\.)[A-Za-z0-9_-]{8,}")
_HANDLER_MARK = "_amux_handler"


@dataclass
class RequestContext:
    """What is known of the request being handled: its id, then who made it."""

    request_id: str
    principal: str | None = None
    client: str | None = None


_CONTEXT: contextvars.ContextVar[RequestContext | None] = contextvars.ContextVar("amux_request", default=None)
# What the edge (hub/web/edge.py) keeps on each request, and its access line reads once the response is sent
REQUEST_ID = web.RequestKey("request_id", str)
CLIENT = web.RequestKey("client", str)  # the client's IP address: the peer, or what a trusted proxy forwarded
LOG_CONTEXT = web.RequestKey("log_context", RequestContext)  # who the request is, for its log lines


def open_request(request_id: str) -> tuple[RequestContext, contextvars.Token[RequestContext | None]]:
    """Start the log context of one request; pass the token to `close_request` when the request ends."""
    ctx = RequestContext(request_id)
    return ctx, _CONTEXT.set(ctx)


def close_request(token: contextvars.Token[RequestContext | None]) -> None:
    """End the log context `open_request` started (the next request on the connection starts clean)."""
    _CONTEXT.reset(token)


def note_caller(principal: str, client: str | None) -> None:
    """Record who the current request is (its lines from now on, and its access line, say so)."""
    ctx = _CONTEXT.get()
    if ctx is not None:
        ctx.principal, ctx.client = principal, client


class _Redactor:
    """Mask token secrets and the configured secret values in a formatted line."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        self.secrets = sorted({s for s in secrets if s and len(s) >= 4}, key=len, reverse=True)

    def __call__(self, text: str) -> str:
        text = _TOKEN.sub(r"\1***", text)
        for s in self.secrets:
            text = text.replace(s, "***")
        return text


class _ContextFilter(logging.Filter):
    """Give every record the fields of the request it was written in (unless it brings its own)."""

    def filter(self, record: logging.LogRecord) -> bool:
        ctx = _CONTEXT.get()
        for name in FIELDS:
            if not hasattr(record, name):
                setattr(record, name, getattr(ctx, name) if ctx is not None else None)
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message, the request context and any structured extras."""

    def __init__(self, redact: _Redactor) -> None:
        super().__init__()
        self.redact = redact

    def format(self, record: logging.LogRecord) -> str:
        """Return the record as one line of JSON."""
        out: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname, "logger": record.name, "message": self.redact(record.getMessage())}
        for name in FIELDS:
            out[name] = getattr(record, name, None)
        for name in EXTRAS:
            if hasattr(record, name):
                out[name] = getattr(record, name)
        if record.exc_info:
            out["exc"] = self.redact(self.formatException(record.exc_info))
        if record.stack_info:
            out["stack"] = self.redact(self.formatStack(record.stack_info))
        return json.dumps(out, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """`time LEVEL logger: message`, then `request_id=… principal=…` when written during a request."""

    def __init__(self, redact: _Redactor) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.redact = redact

    def format(self, record: logging.LogRecord) -> str:
        """Return the record as text, its request context appended."""
        line = super().format(record)
        tail = " ".join(f"{n}={getattr(record, n)}" for n in FIELDS if getattr(record, n, None))
        if tail and record.name != ACCESS:  # an access line says its request id in its message already
            head, sep, rest = line.partition("\n")  # after the message, before any traceback
            line = f"{head} {tail}{sep}{rest}"
        return self.redact(line)


def configure(settings: LogSettings, *, secrets: Iterable[str] = (), stream: TextIO | None = None) -> None:
    """Send every log line to `stream` (stderr) in the configured format; idempotent (the last call wins)."""
    redact = _Redactor(secrets)
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter(redact) if settings.format == "json" else TextFormatter(redact))
    handler.addFilter(_ContextFilter())
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(settings.level_number())
    # access lines are written whatever `level` says, and are off only when `log.access` is
    logging.getLogger(ACCESS).setLevel(logging.INFO if settings.access else logging.CRITICAL + 1)
    logging.captureWarnings(True)  # a library's warning is a log line too, in the same format


def from_env(env: Mapping[str, str]) -> tuple[LogSettings, str | None]:
    """The `log` settings from the environment alone (for the commands that read no configuration file), and
    what was wrong with them, if anything (then the defaults)."""
    raw = {k[len("AMUX_LOG__"):].lower(): v for k, v in env.items() if k.startswith("AMUX_LOG__")}
    if "level" not in raw and env.get("AMUX_LOG_LEVEL"):
        raw["level"] = env["AMUX_LOG_LEVEL"]
    try:
        return LogSettings.model_validate(raw), None
    except ValueError as e:
        return LogSettings(), f"ignoring the AMUX_LOG__* variables: {e}"


def secret_values(settings: Any) -> list[str]:
    """The configured secret values a log line must never show."""
    values = [settings.secret_key, settings.hub.metrics_token]
    for app in settings.feishu.apps:
        values += [app.app_secret, app.encrypt_key, app.verification_token]
    if settings.database_url:
        from sqlalchemy.engine import make_url
        try:
            values.append(make_url(settings.database_url).password)
        except Exception:  # noqa: BLE001 - not a URL SQLAlchemy reads: nothing to take from it
            pass
    return [v for v in values if isinstance(v, str) and v]


class AccessLog(AbstractAccessLogger):
    """One line per HTTP request: method, path (never its query), status, duration, request id, who."""

    def log(self, request: BaseRequest, response: StreamResponse, time: float) -> None:
        """Write the access line of `request` (aiohttp calls this once the response is sent)."""
        try:
            path = request.path
        except Exception:  # noqa: BLE001 - a request line too broken to have a path
            path = "-"
        ctx = request.get(LOG_CONTEXT) if isinstance(request, Mapping) else None
        rid = request.get(REQUEST_ID) if isinstance(request, Mapping) else None
        remote = request.get(CLIENT) if isinstance(request, Mapping) else None
        principal, client = (ctx.principal, ctx.client) if ctx is not None else (None, None)
        ms = round(time * 1000, 1)
        self.logger.info("%s %s %s %.1fms request_id=%s%s", request.method, path, response.status, ms, rid or "-",
                         f" principal={principal}" if principal else "",
                         extra={"request_id": rid, "principal": principal, "client": client,
                                "method": request.method, "path": path, "status": response.status,
                                "duration_ms": ms, "remote": remote or request.remote})

    @property
    def enabled(self) -> bool:
        """Say whether access lines are wanted (`log.access`, set up by `configure`)."""
        return self.logger.isEnabledFor(logging.INFO)
