"""A fake model API that rejects every key, over real HTTP, for the real engine CLIs in the suite.

It answers what the providers answer for a bad key (shapes from their public error docs):
- Anthropic (`POST /v1/messages`, Claude Code): 401 `{"type": "error", "error": {"type": "authentication_error",
  "message": "invalid x-api-key"}}`; with `should_retry=False` also the `x-should-retry: false` header, which the
  Anthropic SDK inside the CLI honours (no retry).
- OpenAI (`POST /v1/responses`, Codex): 401 `{"error": {"message": "Incorrect API key provided: sk-test",
  "type": "invalid_request_error", "code": "invalid_api_key"}}`.
`requests` records (method, path) of everything it was asked.
"""
from __future__ import annotations

from aiohttp import web


class RejectingModelApi:
    """Start with `await api.start()`; `url` is its base (`http://127.0.0.1:PORT`)."""

    def __init__(self, *, should_retry: bool | None = False) -> None:
        self.should_retry = should_retry
        self.requests: list[tuple[str, str]] = []
        self.url = ""
        self._runner: web.AppRunner | None = None

    async def _answer(self, request: web.Request) -> web.Response:
        self.requests.append((request.method, request.path))
        headers = {} if self.should_retry is None else {"x-should-retry": str(self.should_retry).lower()}
        if request.path.endswith("/responses"):
            body = {"error": {"message": "Incorrect API key provided: sk-test", "type": "invalid_request_error",
                              "code": "invalid_api_key"}}
        else:
            body = {"type": "error", "error": {"type": "authentication_error", "message": "invalid x-api-key"},
                    "request_id": "req_fake"}
        return web.json_response(body, status=401, headers=headers)

    async def start(self) -> "RejectingModelApi":
        """Serve on a free loopback port."""
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._answer)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self

    async def stop(self) -> None:
        """Stop serving."""
        if self._runner is not None:
            await self._runner.cleanup()
