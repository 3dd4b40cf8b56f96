"""Serve the MCP SDK's Streamable HTTP app (stateless, JSON) inside aiohttp at `/mcp`."""
from __future__ import annotations

import asyncio
import contextlib
from typing import Any, AsyncIterator

from aiohttp import web
from aiohttp_asgi.resource import ASGIContext
from mcp.server.mcpserver import MCPServer

from ..errors import AmuxError
from ..services.auth import AuthService


class _AuthedContext(ASGIContext):
    """An ASGI bridge that hands the authenticated caller to the app in `scope["state"]`."""

    def __init__(self, app: Any, request: web.Request, state: dict) -> None:
        super().__init__(app, request, "/")
        self._state = state

    @property
    def scope(self) -> dict:
        scope = super().scope
        scope["state"] = self._state
        return scope


class McpMount:
    """Authenticate at the door (401 with the fix), then pass the request to the MCP app."""

    def __init__(self, server: MCPServer, auth: AuthService) -> None:
        self.server = server
        self.auth = auth
        self.asgi = server.streamable_http_app(streamable_http_path="/mcp", stateless_http=True, json_response=True)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Answer one MCP HTTP request."""
        try:
            caller = await self.auth.authenticate(request.headers.get("Authorization"))
        except AmuxError as e:
            return web.json_response({"error": "invalid_token", "error_description": e.message}, status=401,
                                     headers={"WWW-Authenticate": f'Bearer error="invalid_token", error_description="{e.message}"'})
        return await _AuthedContext(self.asgi, request, {"caller": caller}).get_response()

    @contextlib.asynccontextmanager
    async def lifespan(self) -> AsyncIterator[None]:
        """Run the SDK's session manager for the app's lifetime, in a task of its own.

        The SDK's lifespan holds an anyio cancel scope, which must be left by the task that entered it;
        aiohttp may start and clean up an app from different tasks.
        """
        started, stop = asyncio.Event(), asyncio.Event()

        async def hold() -> None:
            async with self.asgi.router.lifespan_context(self.asgi):
                started.set()
                await stop.wait()

        task = asyncio.create_task(hold())
        await asyncio.wait({task, asyncio.create_task(started.wait())}, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # raise the startup error
        try:
            yield
        finally:
            stop.set()
            await task
