"""`amux up` (hub + an in-process runner) and `amux hub serve` (hub only): migrate, serve, write the home's files."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import signal
import socket
from pathlib import Path
from typing import TYPE_CHECKING

from ..clock import within
from ..errors import AmuxError
from .discovery import home_settings
from .options import server_opts

if TYPE_CHECKING:  # the server side loads only for the commands that run it
    from ..app import Hub


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add `up` and `hub serve`."""
    up = sub.add_parser("up", help="hub + in-process runner on the embedded database")
    server_opts(up)
    up.add_argument("--slots", type=int, default=8, help="task slots of the in-process runner (default 8)")
    hub = sub.add_parser("hub", help="hub commands")
    hub_sub = hub.add_subparsers(dest="hub_cmd", required=True)
    serve = hub_sub.add_parser("serve", help="hub only (production)")
    server_opts(serve)


async def run(args: argparse.Namespace) -> None:
    """Serve until SIGINT or SIGTERM: `up` with an in-process runner, `hub serve` without."""
    await _serve(args, with_runner=args.cmd == "up")


async def _token_file(hub: Hub, path: Path, principal: str, label: str, *, runner: bool = False) -> str:
    """Reuse a stored token of the right kind that still works, else mint one and store it (mode 0600).

    `runner`: a shared runner token (made by the operator, so an admin's), for the in-process runner.
    """
    from ..files import private_dir, write_private

    if path.exists():
        token = path.read_text().strip()
        try:
            caller = await hub.auth.authenticate(token, surface="runner" if runner else "api")
            if caller.kind == ("runner" if runner else "admin"):
                if path.stat().st_mode & 0o077:
                    path.chmod(0o600)
                return token
            if runner and caller.admin:  # an older runner.token was an admin token: retire it with the file
                from ..services.auth.service import TokenAdmin
                await TokenAdmin(hub.auth).revoke(caller, caller.token_id)
        except AmuxError:
            pass
    # A runner token made anew replaces the earlier ones: the in-process runtime's name is bound to its token.
    token = await hub.auth.create_token(principal, label=label, admin=True, runner=runner, replace=runner)
    private_dir(path.parent)
    write_private(path, token + "\n")
    return token


def freeze_startup_heap() -> None:
    """Take what start-up allocated (modules, the app, its routes and models: most of the heap) out of the cyclic
    collector's sight, once the process serves. A full collection otherwise walks it all, 110–160 ms with the
    event loop stopped, every few seconds under load (docs/performance.md); it never becomes garbage anyway."""
    gc.collect()
    gc.freeze()


# Long by design: one start-up sequence (hub, token files, in-process runner, signals, shutdown), in order.
async def _serve(args: argparse.Namespace, *, with_runner: bool) -> None:
    from aiohttp import web

    from ..app import Hub
    from ..engines.base import Engine
    from ..engines.registry import default_engines
    from ..runner.agent import Runner
    from ..store.db import upgrade
    from ..web.server import listen_address, url_of

    from .discovery import remove_hub_file, write_hub_file

    from ..files import private_dir

    settings = home_settings(args, create_home=True)
    from .. import logs
    logs.configure(settings.log, secrets=logs.secret_values(settings))  # the configuration's [log], once it is read
    private_dir(settings.home)  # 0700: the database, tokens and secret key live here
    host, port = listen_address(settings.listen)
    where = settings.db_url().split("@")[-1]
    print(f"applying database migrations to {where}…", flush=True)
    await upgrade(settings.db_url())
    print("database at head", flush=True)
    hub = Hub(settings)
    runner_app = hub.app_runner()
    await runner_app.setup()
    site = web.TCPSite(runner_app, host, port)
    try:
        await site.start()
    except OSError as e:
        await runner_app.cleanup()
        await hub.db.close()
        raise AmuxError(f"cannot listen on {host}:{port} ({e.strerror}); pass --listen {host}:0 for a free port") from e
    port = runner_app.addresses[0][1]  # the real port when --listen asked for port 0
    url = url_of(host, port)
    if not settings.public_url:  # runs are told the hub's address (AMUX_HUB_URL): the real one, not port 0
        hub.runner_dispatch.hub_url = url
    hub_file = write_hub_file(settings.home, url)
    admin_token = await _token_file(hub, settings.home / "admin.token", "admin", "cli")
    print(f"amux hub listening on {url}  (MCP: {url}/mcp, database: {hub.db.url.split('@')[-1]})", flush=True)
    print(f"admin token written to {settings.home / 'admin.token'}; hub address written to {hub_file}", flush=True)
    if hub.metrics_url:
        print(f"metrics (hub.metrics_listen): {hub.metrics_url}", flush=True)
    print(f"console (the bot without a Feishu tenant): {url}/console — paste that token; boxes: {url}/boxes",
          flush=True)
    local = None
    tasks = []
    if with_runner:
        runner_token = await _token_file(hub, settings.home / "runner.token", "local-runner", "runner", runner=True)
        engines: dict[str, Engine] = default_engines()
        rs = settings.runner
        local = Runner(url, runner_token, name=f"local-{socket.gethostname()}", slots=args.slots,
                       workspace_root=(settings.home / "workspaces").resolve(), engines=engines,
                       dedicated=rs.dedicated, isolation=rs.isolation, child_network=rs.child_network,
                       egress_allow=tuple(rs.egress_allow), in_hub_process=True, hide=(settings.home.resolve(),),
                       stall_notice_s=rs.stall_notice_s, clock=hub.clock, limits=rs.limits(),
                       cgroup_parent=Path(rs.cgroup_parent) if rs.cgroup_parent else None)
        tasks.append(asyncio.create_task(local.run_forever()))
        print(f"in-process runner {local.name} with {args.slots} slots, engines: {', '.join(sorted(local.engines))}",
              flush=True)
    del admin_token
    if local is not None:  # the collection below stops the loop ~0.1 s: let the in-process runner register first
        with contextlib.suppress(asyncio.TimeoutError):
            await within(local.registered.wait(), 10)
    freeze_startup_heap()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        remove_hub_file(settings.home)  # a stopped hub leaves no address behind for clients to try
    if local:
        await local.stop()
    for t in tasks:
        t.cancel()
    await runner_app.cleanup()
    await hub.db.close()
