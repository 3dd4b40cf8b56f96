"""The MCP endpoint: tools generated from typed models, mounted into the aiohttp app.

May import hub/services, hub/store/db.py (connections, unavailability), hub/domain and the base modules; never
hub/web, bot, hub/app or the CLI."""
