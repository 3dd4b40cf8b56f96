"""A bare MCP SDK server with one echo tool (stateless, JSON responses, logging at WARNING): the peer for ratios.

At INFO the SDK writes a line per stateless request, which slows the peer and flatters every ratio.
Given a PostgreSQL URL, the echo reads its text back from PostgreSQL first (one asyncpg `SELECT $1` on a pooled
connection): the floor of any call that reads the database once, which the bare echo is not.
"""
from __future__ import annotations

import sys

import asyncpg
import uvicorn
from mcp.server.mcpserver import MCPServer


def build(db_url: str | None = None) -> MCPServer:
    """Return the echo server (reading through PostgreSQL at `db_url`, if given)."""
    server = MCPServer("bare", log_level="WARNING")
    pools: list[asyncpg.Pool] = []

    @server.tool()
    async def echo(text: str) -> str:
        """Echo the text."""
        if db_url is None:
            return text
        if not pools:
            # No reset query when a connection goes back (asyncpg's default is a second round trip per call).
            pools.append(await asyncpg.create_pool(db_url, min_size=1, max_size=2, reset=_no_reset))
        return await pools[0].fetchval("SELECT $1::text", text)

    return server


async def _no_reset(conn: asyncpg.Connection) -> None:
    """Leave a connection as it is when it goes back to the pool (the echo sets nothing on it)."""


def serve(port: int, db_url: str | None = None) -> None:
    """Serve the echo server on 127.0.0.1:`port` until killed."""
    app = build(db_url).streamable_http_app(streamable_http_path="/mcp", stateless_http=True, json_response=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else None)
