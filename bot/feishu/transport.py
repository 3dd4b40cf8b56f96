"""One long-lived HTTP client per Feishu application, carrying lark-oapi's request and response models.

lark-oapi 1.x sends every async call through `lark_oapi.core.http.Transport.aexecute`, a static method that
opens and closes a new `httpx.AsyncClient` per call (a fresh TLS context and connection each time), and every
generated resource calls that method by name, so no client can be passed in. The hub keeps lark-oapi's request
builders and response models and sends the built requests here instead, over one `aiohttp.ClientSession` per
application (keep-alive connections, closed by `aclose()`); the tenant token (bot.feishu.token) is fetched over
the same session and passed per call.

Why aiohttp and not a shared `httpx.AsyncClient`: the hub's HTTP stack is aiohttp already, and a send over a
kept-alive connection costs far less CPU through aiohttp (httpcore re-attempts `import sniffio`, which is not
installed, several times per request, and walks its pool per request); docs/performance.md ("The outbox: one
HTTP client per Feishu application") has the figures.
"""
from __future__ import annotations

import urllib.parse
from typing import Any, TypeVar

import aiohttp
from lark_oapi.core.json import JSON
from lark_oapi.core.model import BaseRequest, RawResponse
from lark_oapi.core.utils.user_agent import build_user_agent

R = TypeVar("R")


class AppTransport:
    """Send lark-oapi requests for one application over one pooled, keep-alive `aiohttp.ClientSession`."""

    def __init__(self, base_url: str, timeout_s: float = 10.0, max_connections: int = 32) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_s)
        self.max_connections = max_connections
        self.user_agent = build_user_agent()
        self._session: aiohttp.ClientSession | None = None
        self.requests = 0

    @property
    def session(self) -> aiohttp.ClientSession:
        """The application's session, made on first use (inside the event loop that uses it)."""
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=self.max_connections, keepalive_timeout=60.0)
            self._session = aiohttp.ClientSession(timeout=self.timeout, connector=connector,
                                                  headers={"User-Agent": self.user_agent})
        return self._session

    def url(self, req: BaseRequest) -> str:
        """Return the request's absolute URL, path parameters quoted the way lark-oapi quotes them."""
        uri = req.uri or ""
        for key, value in (req.paths or {}).items():
            uri = uri.replace(":" + key, urllib.parse.quote("" if value is None else str(value), safe=""))
        return uri if uri.startswith(("http://", "https://")) else self.base_url + uri

    async def call(self, req: BaseRequest, token: str, response_type: type[R]) -> R:
        """Send `req` with the tenant `token`; return it as `response_type` with `.raw` set (status, headers).

        Network errors and timeouts raise aiohttp's errors or TimeoutError, and a non-JSON body raises
        ValueError, as lark-oapi's own calls raise; the callers treat every one as transient.
        """
        headers = {**(req.headers or {}), "Authorization": f"Bearer {token}"}
        data = None
        if req.body is not None:
            data = JSON.marshal(req.body).encode("utf-8")
            headers["Content-Type"] = "application/json; charset=utf-8"
        self.requests += 1
        async with self.session.request(req.http_method.name, self.url(req), params=req.queries or None,
                                        data=data, headers=headers) as resp:
            content = await resp.read()
            raw = RawResponse()
            raw.status_code = resp.status
            raw.headers = dict(resp.headers)
            raw.content = content
        out: Any = JSON.unmarshal(content.decode("utf-8"), response_type)
        out.raw = raw
        return out

    async def post_json(self, path: str, body: dict[str, Any]) -> Any:
        """POST `body` as JSON to `path` (no token: the token endpoint itself); return the decoded answer."""
        self.requests += 1
        async with self.session.post(self.base_url + path, json=body) as resp:
            return await resp.json(content_type=None)

    async def aclose(self) -> None:
        """Close the pooled connections (a later call opens a new session)."""
        if self._session is not None:
            await self._session.close()
            self._session = None
