# PYTHON_ARGCOMPLETE_OK
"""The `amux` command line: one parser over every command group's module, and the entry point."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import sys
from types import ModuleType

from ..errors import AmuxError
from . import (alerts, config, credentials, db, identity, instances, memory, profiles, runner, runtimes, schedules,
               serve, sessions, tasks, tokens)
from .exit import exit_code
from .options import global_opts

# Each command's module (`add_parser`, `run`), in the order `amux --help` lists them.
GROUPS: tuple[ModuleType, ...] = (serve, runner, db, tokens, tasks, sessions, instances, memory, profiles, credentials,
                                  schedules, alerts, identity, runtimes, config)
COMMANDS = {"up": serve, "hub": serve, "runner": runner, "db": db, "token": tokens, "task": tasks,
            "session": sessions, "instance": instances, "memory": memory, "profile": profiles,
            "credential": credentials, "schedule": schedules, "alerts": alerts, "feishu": alerts,
            "identity": identity, "runtime": runtimes, "config": config}


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("amux-hub")
    except PackageNotFoundError:  # run from a tree that was never installed
        return "0+unknown"


def build_parser() -> argparse.ArgumentParser:
    """Return the `amux` argument parser."""
    ap = argparse.ArgumentParser(prog="amux", description="amux hub: run coding-agent work on a fleet of machines",
                                 epilog="exit codes: 0 ok; 1 a waited task or Turn ended other than succeeded; "
                                        "2 usage; 3 refused or not found; 4 hub unreachable; 5 --timeout elapsed "
                                        "while waiting")
    ap.add_argument("--version", action="version", version=f"amux {_version()}")
    global_opts(ap)
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="COMMAND")
    for group in GROUPS:
        group.add_parser(sub)
    return ap


def _complete(parser: argparse.ArgumentParser) -> None:
    """Answer a shell's completion request (argcomplete sets _ARGCOMPLETE) and exit; otherwise do nothing."""
    if "_ARGCOMPLETE" not in os.environ:
        return
    try:
        import argcomplete
    except ImportError:  # completion is a convenience: without the package the shell just completes nothing
        return
    argcomplete.autocomplete(parser)


def _quiet_stdout() -> None:
    """After a closed pipe (`amux task list | head`): point stdout at /dev/null so the exit flush says nothing."""
    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `amux` console script; the exit codes are hub/cli/exit.py's (README "Command line")."""
    parser = build_parser()
    _complete(parser)
    args = parser.parse_args(argv)
    if getattr(args, "home", None):
        os.environ["AMUX_HOME"] = args.home  # --home is $AMUX_HOME for this command (config, discovery, tokens)
    from .. import logs
    log_settings, log_problem = logs.from_env(os.environ)  # `up` / `hub serve` reconfigure from their settings
    logs.configure(log_settings)
    if log_problem:
        logging.getLogger("amux").warning("%s", log_problem)
    try:
        asyncio.run(COMMANDS[args.cmd].run(args))
        sys.stdout.flush()
    except BrokenPipeError as e:
        _quiet_stdout()
        return exit_code(e)
    except AmuxError as e:
        print(f"amux: {e.message}", file=sys.stderr)
        return exit_code(e)
    except KeyboardInterrupt as e:
        return exit_code(e)
    except OSError as e:  # a home file that cannot be read or written: one line, not a traceback
        where = f" {e.filename}" if e.filename else ""
        print(f"amux: {e.strerror or e}:{where}; check AMUX_HOME (or --db / --config) and its permissions",
              file=sys.stderr)
        return exit_code(e)
    return 0
