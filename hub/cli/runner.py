"""`amux runner`: connect this machine to a hub as a runtime, until SIGINT or SIGTERM."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import socket
from pathlib import Path
from typing import Mapping

from ..domain.limits import Limits, parse_size
from ..errors import Invalid
from .exit import UsageError
from .options import HUB_HELP, argument

ARGV_TOKEN = ("the runner token was given on the command line (--token): `ps` shows it to every local user; pass "
              "it with --token-file PATH (a file only you can read) or the AMUX_TOKEN environment variable instead")


def _pids(text: str) -> int:
    return Limits.parse({"pids_max": int(text) if text.isdigit() else text}, "--pids-max").pids_max or 0


def _cores(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise Invalid(f"--cpu-max {text!r} is not a number of cores; pass e.g. 1.5") from None
    return Limits.parse({"cpu_max": value}, "--cpu-max").cpu_max or 0.0


def _stall_seconds(text: str) -> float:
    """Parse `--stall-notice-s`: seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds; pass e.g. 300, or 0 to turn it off")
    return value


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add `runner`."""
    run = sub.add_parser("runner", help="connect this machine to a hub as a runtime")
    run.add_argument("--hub", default=argparse.SUPPRESS, help=HUB_HELP)
    given = run.add_mutually_exclusive_group()
    given.add_argument("--token-file", metavar="PATH",
                       help="read the runner token from this file (default: $AMUX_TOKEN)")
    given.add_argument("--token", default=argparse.SUPPRESS,
                       help="the runner token itself; avoid it: `ps` shows argv to every local user "
                       "(use --token-file or AMUX_TOKEN)")
    run.add_argument("--slots", type=int, default=4, help="tasks this runner runs at once (default 4)")
    run.add_argument("--name", help="the runtime's name on the hub (default: this host's name)")
    run.add_argument("--workspace-root", metavar="DIR",
                     help="where task workspaces are made (default ~/.amux/workspaces)")
    run.add_argument("--authoring", action="store_true",
                     help="offer the authoring capability: profiles with local expert authoring may run here")
    run.add_argument("--isolation", help="execution modes to offer, comma-separated: linux-dac (each principal's "
                     "children under a uid of their own, as root with bubblewrap), userns (the rootless sandbox of a "
                     "runner that is not root, with bubblewrap) and/or process (this runner's own uid, with "
                     "--dedicated); default: every mode this machine can provide")
    run.add_argument("--dedicated", action="store_true",
                     help="declare this machine and user dedicated to task children: process mode may be offered")
    run.add_argument("--child-network", choices=("isolated", "host"), default="isolated",
                     help="sandboxed (linux-dac, userns) children's network: isolated (the hub and public egress "
                     "only; default) or host")
    run.add_argument("--egress-allow", action="append", default=[], metavar="HOST[:PORT]",
                     help="a non-public destination isolated children may reach (repeatable)")
    run.add_argument("--share-engine-login", action="store_true",
                     help="let process-mode children use this runner user's own engine login (~/.claude, ~/.codex)")
    run.add_argument("--stall-notice-s", type=_stall_seconds, default=300.0, metavar="SECONDS",
                     help="a run whose engine says nothing this long gets a status event (default 300; 0 = off)")
    run.add_argument("--memory-max", type=argument(parse_size), metavar="SIZE",
                     help="each task child's memory, its whole process tree (default 4GiB); a profile or task may "
                     "only lower it")
    run.add_argument("--pids-max", type=argument(_pids), metavar="N",
                     help="each task child's processes and threads (default 1024)")
    run.add_argument("--cpu-max", type=argument(_cores), metavar="CORES",
                     help="each task child's CPU in cores, e.g. 1.5 (default: this machine's cores less one)")
    run.add_argument("--cgroup-parent", metavar="DIR",
                     help="a cgroup delegated to this runner's user (not root), under which each run gets its own "
                     "group: a cgroup v2 directory, or a path relative to each v1 controller's mount")


def runner_token(argv_token: str | None, token_file: str | None, env: Mapping[str, str]) -> str:
    """Return the runner's token from --token-file, AMUX_TOKEN or --token (warned about: argv is public)."""
    if token_file:
        try:
            token = Path(token_file).read_text().strip()
        except OSError as e:
            raise UsageError(f"cannot read --token-file {token_file}: {e.strerror or e}; point it at the file holding "
                            "the runner token (`amux token create --principal NAME --runner`)") from e
        if not token:
            raise UsageError(f"--token-file {token_file} is empty; write the runner token into it "
                            "(`amux token create --principal NAME --runner`)")
        return token
    if argv_token:
        logging.getLogger("amux.runner").warning("%s", ARGV_TOKEN)
        return argv_token
    token = env.get("AMUX_TOKEN", "").strip()
    if not token:
        raise UsageError("amux runner needs a token: --token-file PATH or AMUX_TOKEN; create one with `amux token "
                        "create --principal NAME --runner`")
    return token


async def run(args: argparse.Namespace) -> None:
    """Run the runner until a signal stops it, or until it fails (then raise what failed)."""
    from ..engines.registry import default_engines
    from ..runner.agent import Runner

    token = runner_token(args.token, args.token_file, os.environ)
    root = Path(args.workspace_root or Path.home() / ".amux" / "workspaces")
    from .discovery import resolve_hub

    runner = Runner(resolve_hub(args.hub).url, token, name=args.name or socket.gethostname(), slots=args.slots,
                    workspace_root=root, engines=default_engines(), authoring=args.authoring,
                    dedicated=args.dedicated, child_network=args.child_network, egress_allow=tuple(args.egress_allow),
                    isolation=[m.strip() for m in args.isolation.split(",") if m.strip()] if args.isolation else None,
                    share_engine_login=args.share_engine_login, stall_notice_s=args.stall_notice_s,
                    limits=Limits(args.memory_max, args.pids_max, args.cpu_max),
                    cgroup_parent=Path(args.cgroup_parent) if args.cgroup_parent else None)
    loop = asyncio.get_running_loop()
    stopper = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stopper.set)
    main = asyncio.create_task(runner.run_forever())
    waiter = asyncio.create_task(stopper.wait())
    done, _ = await asyncio.wait({main, waiter}, return_when=asyncio.FIRST_COMPLETED)
    await runner.stop()
    main.cancel()
    failure = main.exception() if main in done else None
    if failure is not None:
        raise failure
