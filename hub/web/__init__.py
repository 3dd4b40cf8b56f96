"""HTTP adapters: the edge (request ids, limits), REST, runner WebSocket, MCP mount, OAuth, pages, health and metrics.

May import hub/mcp, hub/services, hub/runner/protocol.py, hub/store/db.py (connections, unavailability), hub/logs,
hub/loops, hub/domain and the base modules; never bot, hub/app or the CLI."""
