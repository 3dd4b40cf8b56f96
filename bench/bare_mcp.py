"""A bare MCP SDK server with one echo tool (stateless, JSON responses, logging at WARNING): the peer for ratios.

At INFO the SDK writes a line per stateless request, which slows the peer and flatters every ratio (issue 16).
"""
from __future__ import annotations

import sys

import uvicorn
from mcp.server.mcpserver import MCPServer


def build() -> MCPServer:
    """Return the echo server."""
    server = MCPServer("bare", log_level="WARNING")

    @server.tool()
    async def echo(text: str) -> str:
        """Echo the text."""
        return text

    return server


def serve(port: int) -> None:
    """Serve the echo server on 127.0.0.1:`port` until killed."""
    app = build().streamable_http_app(streamable_http_path="/mcp", stateless_http=True, json_response=True)
    uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")


if __name__ == "__main__":
    serve(int(sys.argv[1]))
