"""What an isolated linux-dac child may reach: the hub, and public hosts through a CONNECT proxy (README
"Execution modes").

For each run the runner serves two Unix sockets in the run's bridge folder, which the child's init forwards to its
loopback: `hub.sock` carries bytes to the hub's address, `proxy.sock` is an HTTP CONNECT proxy that connects only
to public addresses (loopback, private, link-local and other special ranges are refused, so nothing on the runner's
network is reachable merely because it is there) or to the operator's `runner.egress_allow` entries.
"""
from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from pathlib import Path
from typing import Iterable

from .childinit import pipe

log = logging.getLogger("amux.runner.egress")
HEAD_LIMIT = 16 * 1024


def public(address: str) -> bool:
    """Say whether an IP address is a public one (not loopback, private, link-local, multicast, reserved...)."""
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return ip.is_global and not ip.is_multicast


class Egress:
    """The bridge sockets of one run: the hub's address and the egress proxy."""

    def __init__(self, folder: Path, hub: tuple[str, int] | None, allow: Iterable[str] = ()) -> None:
        self.folder = folder
        self.hub = hub
        self.allow = {a.lower() for a in allow}
        self._servers: list[asyncio.AbstractServer] = []

    async def start(self) -> None:
        """Serve `hub.sock` (when the hub is reached over plain HTTP) and `proxy.sock` in the folder (0700, root)."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        if self.hub is not None:
            self._servers.append(await asyncio.start_unix_server(self._to_hub, path=str(self.folder / "hub.sock")))
        self._servers.append(await asyncio.start_unix_server(self._proxy, path=str(self.folder / "proxy.sock")))

    async def close(self) -> None:
        """Stop serving and remove the sockets."""
        for server in self._servers:
            server.close()
        for name in ("hub.sock", "proxy.sock"):
            with contextlib.suppress(OSError):
                (self.folder / name).unlink()
        with contextlib.suppress(OSError):
            self.folder.rmdir()

    async def _to_hub(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert self.hub is not None
        try:
            up_r, up_w = await asyncio.open_connection(*self.hub)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))

    def allowed(self, host: str, port: int) -> bool:
        """Say whether the operator's allow-list names this destination (`host` or `host:port`)."""
        host = host.lower().strip("[]")
        return host in self.allow or f"{host}:{port}" in self.allow

    async def _proxy(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 30)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, asyncio.TimeoutError, ConnectionError):
            writer.close()
            return
        line = head.split(b"\r\n", 1)[0].decode("latin-1").split()
        if len(line) < 2 or line[0].upper() != "CONNECT" or len(head) > HEAD_LIMIT:
            await self._refuse(writer, "405 Method Not Allowed", "only CONNECT host:port is proxied")
            return
        host, _, port_text = line[1].rpartition(":")
        try:
            port = int(port_text)
        except ValueError:
            await self._refuse(writer, "400 Bad Request", "CONNECT needs host:port")
            return
        host = host.strip("[]")
        try:
            infos = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except OSError:
            await self._refuse(writer, "502 Bad Gateway", f"cannot resolve {host}")
            return
        addresses = [str(info[4][0]) for info in infos]
        if not self.allowed(host, port) and not all(public(a) for a in addresses):
            log.info("egress refused: %s:%s is not a public address", host, port)
            await self._refuse(writer, "403 Forbidden", f"{host}:{port} is not a public address; the operator "
                               "allows it with runner.egress_allow")
            return
        try:
            up_r, up_w = await asyncio.open_connection(addresses[0], port)
        except OSError as e:
            await self._refuse(writer, "502 Bad Gateway", f"cannot connect to {host}:{port} ({e})")
            return
        writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        await writer.drain()
        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))

    @staticmethod
    async def _refuse(writer: asyncio.StreamWriter, status: str, why: str) -> None:
        body = why.encode()
        writer.write(f"HTTP/1.1 {status}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        with contextlib.suppress(ConnectionError):
            await writer.drain()
        writer.close()
