"""The init of an isolated sandboxed child (`python -I …/childinit.py --forward PORT=SOCKET ... -- COMMAND`).

It runs first inside the child's own network namespace, where only loopback exists: it listens on 127.0.0.1:PORT
for each `--forward` and carries each connection to the runner's socket bound in the sandbox (the hub, the egress
proxy), then runs COMMAND (which drops to the child's uid in linux-dac) and exits with its code. Nothing else is
reachable. It imports the standard library alone: it runs by its path, in isolated mode, wherever the runner's
packages come from (a virtualenv, an editable checkout, PYTHONPATH).
"""
from __future__ import annotations

import asyncio
import contextlib
import sys
from typing import Awaitable, Callable


async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Copy `reader` to `writer` until either side ends; close the writer."""
    try:
        while chunk := await reader.read(1 << 16):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(Exception):
            writer.close()


def _forwarder(socket_path: str) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]:
    async def carry(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_unix_connection(socket_path)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_w), pipe(up_r, writer))
    return carry


async def main(argv: list[str]) -> int:
    """Start the forwards, run the command, return its exit code."""
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1:]
    servers = []
    for i in range(0, len(options), 2):
        if options[i] != "--forward":
            raise SystemExit(f"childinit: unexpected argument {options[i]!r}")
        port, _, path = options[i + 1].partition("=")
        servers.append(await asyncio.start_server(_forwarder(path), "127.0.0.1", int(port)))
    proc = await asyncio.create_subprocess_exec(*command)
    code = await proc.wait()
    for server in servers:
        server.close()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1:])))
