"""The MCP endpoint: tools generated from typed models, mounted into the aiohttp app."""
