"""A bare MCP SDK server with one echo tool (stateless, JSON responses): the peer for overhead ratios."""
from __future__ import annotations

import sys

import uvicorn
from mcp.server.mcpserver import MCPServer

server = MCPServer("bare")


@server.tool()
async def echo(text: str) -> str:
    """Echo the text."""
    return text


if __name__ == "__main__":
    app = server.streamable_http_app(streamable_http_path="/mcp", stateless_http=True, json_response=True)
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
