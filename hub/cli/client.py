"""The REST client of the commands that call a hub over HTTP (`/api/v1`), and where it finds the hub and token."""
from __future__ import annotations

import argparse
import json

from .discovery import resolve_hub, resolve_token
from .exit import HubRefused, HubUnreachable


class ApiClient:
    """A small REST client for the CLI."""

    def __init__(self, hub: str, token: str, source: str = "--hub") -> None:
        self.hub = hub.rstrip("/")
        self.token = token
        self.source = source   # where the URL came from, said when the hub cannot be reached

    async def call(self, method: str, path: str, body: dict | None = None, params: dict | None = None,
                   data: str | None = None) -> dict:
        """Call `/api/v1/<path>` and return JSON, raising AmuxError on refusals."""
        import aiohttp

        # trust_env: HTTPS_PROXY / HTTP_PROXY / NO_PROXY, as curl does (a sandboxed child reaches an https hub only
        # through the runner's egress proxy).
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {self.token}"}, trust_env=True) as http:
            try:
                async with http.request(method, f"{self.hub}/api/v1/{path}", json=body, params=params,
                                        data=data) as resp:
                    text = await resp.text()
            except aiohttp.ClientConnectionError as e:
                raise HubUnreachable(f"cannot reach the hub at {self.hub} (from {self.source}): {e}; start it "
                                     "with `amux up`, or pass --hub URL / set AMUX_HUB_URL / set AMUX_HOME to the "
                                     "home of the running hub") from e
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if resp.status >= 500 or not isinstance(data, dict):
            raise HubUnreachable(f"the hub at {self.hub} (from {self.source}) answered {resp.status} "
                                 f"{(data or {}).get('message') if isinstance(data, dict) else text[:200]!r}; "
                                 "check that URL is an amux hub and its log")
        if resp.status >= 400:
            raise HubRefused(data.get("message") or str(data), resp.status)
        return data


def client(args: argparse.Namespace) -> ApiClient:
    """Return the REST client: hub from --hub / AMUX_HUB_URL / $AMUX_HOME/hub.json / default; token likewise."""
    token = resolve_token(args.token)
    where = resolve_hub(args.hub)
    return ApiClient(where.url, token, where.source)
