"""HTTP adapters: REST, runner WebSocket, MCP mount, health and metrics."""
