"""The `amux` CLI honours HTTP(S)_PROXY and NO_PROXY, as a sandboxed child that reaches an https hub through the
runner's egress proxy needs it to."""
from __future__ import annotations

import asyncio
import os
import socket
import sys

from tests.helpers import REPO, start_hub


async def forward_proxy(hub_port: int, seen: list[str]) -> asyncio.AbstractServer:
    """A plain-HTTP forward proxy that takes absolute-form requests for any host to the hub on loopback."""
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        line = head.split(b"\r\n", 1)[0].decode()
        seen.append(line)
        method, target, version = line.split(" ")
        path = "/" + target.split("://", 1)[1].split("/", 1)[1]
        up_r, up_w = await asyncio.open_connection("127.0.0.1", hub_port)
        lines = [h for h in head.split(b"\r\n")[1:] if h and not h.lower().startswith((b"connection:",
                                                                                      b"proxy-connection:"))]
        up_w.write(b"\r\n".join([f"{method} {path} {version}".encode(), *lines, b"Connection: close", b"", b""]))
        length = next((int(h.split(b":", 1)[1]) for h in head.split(b"\r\n")
                       if h.lower().startswith(b"content-length:")), 0)
        if length:
            up_w.write(await reader.readexactly(length))
        await up_w.drain()
        writer.write(await up_r.read())
        await writer.drain()
        writer.close()
        up_w.close()
    return await asyncio.start_server(serve, "127.0.0.1", 0)


async def test_the_cli_reaches_the_hub_through_the_proxy_its_environment_names(sqlite_url, tmp_path, clock):
    hub = await start_hub(sqlite_url, tmp_path / "home", clock)
    seen: list[str] = []
    proxy = await forward_proxy(int(hub.url.rsplit(":", 1)[1]), seen)
    try:
        port = proxy.sockets[0].getsockname()[1]
        env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
        nothing = socket.socket()
        nothing.bind(("127.0.0.1", 0))
        closed = nothing.getsockname()[1]  # no one listens here: only the proxy reaches the hub
        nothing.close()
        env.update(AMUX_HUB_URL=f"http://127.0.0.1:{closed}", AMUX_TOKEN=hub.admin_token,
                   HTTP_PROXY=f"http://127.0.0.1:{port}", NO_PROXY="")
        cli = await asyncio.create_subprocess_exec(sys.executable, "-m", "hub.cli", "memory", "set", "k", "v",
                                                   cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.STDOUT)
        out, _ = await cli.communicate()
        assert cli.returncode == 0, out
        assert seen and seen[0].startswith(f"PUT http://127.0.0.1:{closed}/api/v1/memory/k "), seen
        env["NO_PROXY"] = "127.0.0.1"  # named in NO_PROXY: straight to the closed port, not through the proxy
        cli = await asyncio.create_subprocess_exec(sys.executable, "-m", "hub.cli", "memory", "get", "k",
                                                   cwd=REPO, env=env, stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.STDOUT)
        out, _ = await cli.communicate()
        assert cli.returncode != 0 and len(seen) == 1, (out, seen)
    finally:
        proxy.close()
        await hub.stop()
