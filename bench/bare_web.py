"""A bare aiohttp handler answering an HTML page of a given size: the floor for the Boxes page.

    python -m bench.bare_web PORT SIZE
"""
from __future__ import annotations

import sys

from aiohttp import web


def page(size: int) -> bytes:
    """Return an HTML table of about `size` bytes."""
    row = b"<tr data-task=\"task_00000000\"><td>bench task</td><td>mcp:Claude</td><td>live</td></tr>\n"
    head, tail = b"<!doctype html><html><body><table>\n", b"</table></body></html>\n"
    n = max(0, (size - len(head) - len(tail)) // len(row))
    body = head + row * n + tail
    return body + b" " * max(0, size - len(body))


def serve(port: int, size: int) -> None:
    """Serve GET / with the page until killed."""
    body = page(size)

    async def handler(_request: web.Request) -> web.Response:
        return web.Response(body=body, content_type="text/html")

    app = web.Application()
    app.router.add_get("/", handler)
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None)


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
