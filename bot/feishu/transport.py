"""One long-lived HTTP client per Feishu application, carrying lark-oapi's request and response models.

lark-oapi 1.x sends every async call through `lark_oapi.core.http.Transport.aexecute`, a static method that
opens and closes a new `httpx.AsyncClient` per call (a fresh TLS context and connection each time, ~27 ms of
CPU), and every generated resource calls that method by name, so no client can be passed in. The hub keeps
lark-oapi's request builders and response models and sends the built requests here instead: one
`httpx.AsyncClient` per application (keep-alive connections, one TLS context for the process), closed by
`aclose()`. The tenant token comes from `bot.feishu.token` and is passed per call.
"""
from __future__ import annotations

import ssl
import urllib.parse
from typing import Any, TypeVar

import httpx
from lark_oapi.core.json import JSON
from lark_oapi.core.model import BaseRequest, RawResponse
from lark_oapi.core.utils.user_agent import build_user_agent

R = TypeVar("R")
_SSL: ssl.SSLContext | None = None


def _ssl_context() -> ssl.SSLContext:
    """Build the process's one TLS context on first use (loading the CA bundle is the expensive part)."""
    global _SSL
    if _SSL is None:
        _SSL = httpx.create_ssl_context()
    return _SSL


class AppTransport:
    """Send lark-oapi requests for one application over one pooled, keep-alive `httpx.AsyncClient`."""

    def __init__(self, base_url: str, timeout_s: float = 10.0, max_connections: int = 32) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self.user_agent = build_user_agent()
        self._http: httpx.AsyncClient | None = None
        self.requests = 0

    @property
    def http(self) -> httpx.AsyncClient:
        """The application's client, made on first use (inside the event loop that uses it)."""
        if self._http is None or self._http.is_closed:
            limits = httpx.Limits(max_connections=self.max_connections, max_keepalive_connections=self.max_connections,
                                  keepalive_expiry=60.0)
            self._http = httpx.AsyncClient(timeout=self.timeout_s, limits=limits, verify=_ssl_context(),
                                           trust_env=False, headers={"User-Agent": self.user_agent})
        return self._http

    def url(self, req: BaseRequest) -> str:
        """Return the request's absolute URL, path parameters quoted the way lark-oapi quotes them."""
        uri = req.uri or ""
        for key, value in (req.paths or {}).items():
            uri = uri.replace(":" + key, urllib.parse.quote("" if value is None else str(value), safe=""))
        return uri if uri.startswith(("http://", "https://")) else self.base_url + uri

    async def call(self, req: BaseRequest, token: str, response_type: type[R]) -> R:
        """Send `req` with the tenant `token`; return it as `response_type` with `.raw` set (status, headers).

        Network errors and timeouts raise httpx's errors and a non-JSON body raises ValueError, as lark-oapi's
        own calls do; the callers classify both as transient.
        """
        headers = {**(req.headers or {}), "Authorization": f"Bearer {token}"}
        content = None
        if req.body is not None:
            content = JSON.marshal(req.body).encode("utf-8")
            headers["Content-Type"] = "application/json; charset=utf-8"
        self.requests += 1
        resp = await self.http.request(req.http_method.name, self.url(req), params=req.queries or None,
                                       content=content, headers=headers)
        raw = RawResponse()
        raw.status_code = resp.status_code
        raw.headers = dict(resp.headers)
        raw.content = resp.content
        out: Any = JSON.unmarshal(resp.content.decode("utf-8"), response_type)
        out.raw = raw
        return out

    async def aclose(self) -> None:
        """Close the pooled connections."""
        if self._http is not None:
            await self._http.aclose()
            self._http = None
