# PYTHON_ARGCOMPLETE_OK
"""The `amux` command line."""
from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import socket
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Mapping

from .cli_discovery import DEFAULT_HUB, check_home, listen_address, url_of
from .cli_exit import HubRefused, HubUnreachable, UsageError, exit_code, outcome
from .domain.limits import Limits, limits_text, parse_size
from .errors import AmuxError, Invalid

if TYPE_CHECKING:  # the server side loads only for the commands that run it
    from .app import Hub
    from .config import Settings


def _print(args: argparse.Namespace, data: Any, human: str | None = None) -> None:
    if getattr(args, "json", False) or human is None:
        print(json.dumps(data, indent=2, ensure_ascii=False))
    else:
        print(human)


# ---------------------------------------------------------------- server side

def _settings(args: argparse.Namespace, *, create_home: bool = False) -> Settings:
    """Load settings; the home must exist (or is created by `create_home`) unless --db names another database."""
    from .config_sources import load_settings

    settings = load_settings(getattr(args, "config", None), database_url=getattr(args, "db", None),
                             listen=getattr(args, "listen", None))
    if create_home or not settings.database_url or settings.home.exists():
        check_home(settings.home, create=create_home)
    return settings


async def _token_file(hub: Hub, path: Path, principal: str, label: str, *, runner: bool = False) -> str:
    """Reuse a stored token of the right kind that still works, else mint one and store it (mode 0600).

    `runner`: a shared runner token (made by the operator, so an admin's), for the in-process runner.
    """
    from .files import private_dir, write_private

    if path.exists():
        token = path.read_text().strip()
        try:
            caller = await hub.auth.authenticate(token, surface="runner" if runner else "api")
            if caller.kind == ("runner" if runner else "admin"):
                if path.stat().st_mode & 0o077:
                    path.chmod(0o600)
                return token
            if runner and caller.admin:  # an older runner.token was an admin token: retire it with the file
                from .services.auth import TokenAdmin
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

    from .app import Hub
    from .engines.base import Engine
    from .engines.registry import default_engines
    from .runner.agent import Runner
    from .store.db import upgrade

    from .cli_discovery import remove_hub_file, write_hub_file

    from .files import private_dir

    settings = _settings(args, create_home=True)
    from . import logs
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
            await asyncio.wait_for(local.registered.wait(), 10)
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


ARGV_TOKEN = ("the runner token was given on the command line (--token): `ps` shows it to every local user; pass "
              "it with --token-file PATH (a file only you can read) or the AMUX_TOKEN environment variable instead")


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


async def _runner(args: argparse.Namespace) -> None:
    from .engines.registry import default_engines
    from .runner.agent import Runner

    token = runner_token(args.token, args.token_file, os.environ)
    root = Path(args.workspace_root or Path.home() / ".amux" / "workspaces")
    from .cli_discovery import resolve_hub

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


async def _db_upgrade(args: argparse.Namespace) -> None:
    from .store.db import upgrade

    settings = _settings(args)
    await upgrade(settings.db_url())
    print(f"database at head: {settings.db_url().split('@')[-1]}")


async def _token_create(args: argparse.Namespace) -> None:
    from .app import Hub
    from .store.db import upgrade

    settings = _settings(args)
    await upgrade(settings.db_url())
    hub = Hub(settings)
    try:
        token = await hub.auth.create_token(args.principal, label=args.label, admin=args.admin, kind=args.kind,
                                            runner=args.runner)
    finally:
        await hub.db.close()
    kind = "runner" if args.runner else "admin" if args.admin else "user"
    _print(args, {"id": "tok_" + token.split(".")[1], "principal": args.principal, "kind": kind,
                  "label": args.label or ("runner" if args.runner else None), "admin": args.admin and not args.runner,
                  "shared": args.admin and args.runner, "token": token},
           f"{token}\n(shown once; store it now — only its hash is kept)")


async def _token(args: argparse.Namespace) -> None:
    """`amux token create` works on the database (the operator's); `list` and `revoke` go through REST."""
    if args.token_cmd == "create":
        await _token_create(args)
        return
    api = _client(args)
    if args.token_cmd == "list":
        res = await api.call("GET", "tokens", params={"all": "1"} if args.all else None)
        lines = [f"{t['id']}  {t['kind']:<6} {t['principal']:<16} {t['label'] or '-':<24} created {t['created'][:19]}  "
                 f"last used {(t['last_used'] or '-')[:19]}  "
                 f"{'revoked ' + t['revoked'][:19] if t['revoked'] else 'active'}"
                 for t in res["tokens"]]
        lines += [f"{g['id']}  grant  {g.get('principal') or '-':<16} {g['client']:<24} "
                  f"scopes {' '.join(g['scopes'])}  approved by {g['approved_by'] or 'a browser sign-in'}  "
                  f"created {g['created'][:19]}"
                  for g in res.get("grants", [])]
        _print(args, res, "\n".join(lines) or "no tokens")
    else:
        t = await api.call("DELETE", f"tokens/{args.id}")
        _print(args, t, f"{t['id']}: revoked")


# ---------------------------------------------------------------- client side

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


def _client(args: argparse.Namespace) -> ApiClient:
    """Return the REST client: hub from --hub / AMUX_HUB_URL / $AMUX_HOME/hub.json / default; token likewise."""
    from .cli_discovery import resolve_hub, resolve_token

    token = resolve_token(args.token)
    where = resolve_hub(args.hub)
    return ApiClient(where.url, token, where.source)


async def _task(args: argparse.Namespace) -> None:
    api = _client(args)
    if args.task_cmd == "submit":
        prompt = args.prompt
        if prompt in (None, "-"):
            prompt = sys.stdin.read()
        body = {k: v for k, v in {"prompt": prompt, "profile": args.profile, "runtime": args.runtime,
                                  "model": args.model, "extra_args": args.arg or None,
                                  "timeout_s": args.timeout, "name": args.name, "reasoning_effort": args.effort,
                                  "permission_policy": args.policy, "credential_profile": args.credential,
                                  "isolation": args.isolation}.items()
                if v is not None}
        limits = {k: v for k, v in (("memory_max", args.memory_max), ("pids_max", args.pids_max),
                                    ("cpu_max", args.cpu_max)) if v is not None}
        if limits:
            body["limits"] = limits
        sub = await api.call("POST", "tasks", body)
        if not args.wait:
            _print(args, sub, sub["task_id"])
            return
        args.id = sub["task_id"]
        args.timeout = None
        await _wait(args, api)
    elif args.task_cmd == "get":
        t = await api.call("GET", f"tasks/{args.id}")
        _print(args, t, _human(t))
    elif args.task_cmd == "wait":
        await _wait(args, api)
    elif args.task_cmd == "cancel":
        t = await api.call("POST", f"tasks/{args.id}/cancel")
        _print(args, t, f"{t['task_id']}: {t['status']}")
    elif args.task_cmd == "list":
        data = await api.call("GET", "tasks")
        _print(args, data, "\n".join(f"{t['task_id']}  {t['status']:<10} {t['name'] or ''}" for t in data["tasks"]))


def event_line(ev: dict) -> str:
    """Return one task event as a readable line (text, tool calls, usage; other kinds as compact JSON)."""
    kind = ev.get("type")
    if kind in ("text", "question"):
        body = ev.get("text") or ""
    elif kind in ("tool", "permission") and isinstance(ev.get("tool"), dict):
        t = ev["tool"]
        body = " ".join(str(x) for x in (t.get("name"), t.get("title")) if x) + (
            f" ({t['status']})" if t.get("status") else "")
    elif kind == "permission":
        body = " ".join(str(x) for x in (ev.get("tool"), ev.get("title")) if x)
    elif kind == "usage" and isinstance(ev.get("usage"), dict):
        body = " ".join(f"{k}={v}" for k, v in ev["usage"].items())
    else:
        rest = {k: v for k, v in ev.items() if k not in ("seq", "type", "ts", "created_at")}
        body = json.dumps(rest, ensure_ascii=False, separators=(", ", ": ")) if rest else ""
    return f"  [{ev.get('seq')}] {kind}: {body}".rstrip()


WAIT_REASON_POLL_S = 2.0  # a task still queued after this is said to wait, and why; reread as often


async def _wait(args: argparse.Namespace, api: ApiClient) -> None:
    """Follow a task's events until it ends or `--timeout` elapses (each long poll asks for no more than is left)."""
    cursor = 0
    loop = asyncio.get_running_loop()
    deadline = None if args.timeout is None else loop.time() + args.timeout
    waiting: str | None = None  # the reason last printed while the task was queued
    polls = 0
    while True:
        poll = 25.0 if polls else WAIT_REASON_POLL_S
        polls += 1
        if waiting is not None or (cursor == 0 and polls > 1):  # still queued: why it waits, and when that changes
            t = await api.call("GET", f"tasks/{args.id}")
            if t["status"] == "queued":
                reason = t.get("waiting_for") or "waiting to be placed"
                if reason != waiting:
                    print(f"queued: {reason}", file=sys.stderr if args.json else sys.stdout, flush=True)
                waiting, poll = reason, WAIT_REASON_POLL_S
            else:
                waiting = None
        left = poll if deadline is None else max(0.0, min(poll, deadline - loop.time()))
        page = await api.call("GET", f"tasks/{args.id}/wait", params={"cursor": cursor, "timeout_s": round(left, 3)})
        for ev in page["events"]:
            if not args.json:
                print(event_line(ev), flush=True)
        cursor = page["cursor"]
        if page["done"] or (deadline is not None and loop.time() >= deadline):
            break
    t = await api.call("GET", f"tasks/{args.id}")
    _print(args, t, _human(t))
    outcome(t["status"], f"task {t['task_id']}")


async def _memory(args: argparse.Namespace) -> None:
    api = _client(args)
    if args.memory_cmd == "get":
        res = await api.call("GET", f"memory/{args.key}")
        _print(args, res, res["value"])
    elif args.memory_cmd == "set":
        value = args.value if args.value not in (None, "-") else sys.stdin.read()
        res = await api.call("PUT", f"memory/{args.key}", {"value": value})
        _print(args, res, f"stored {args.key} in {res['scope']}")
    elif args.memory_cmd == "delete":
        res = await api.call("DELETE", f"memory/{args.key}")
        _print(args, res, f"deleted {args.key} from {res['scope']}")
    else:
        res = await api.call("GET", "memory")
        _print(args, res, "\n".join(res["keys"]))


async def _profile(args: argparse.Namespace) -> None:
    api = _client(args)
    if args.profile_cmd == "add":
        text = sys.stdin.read() if args.file == "-" else Path(args.file).read_text()
        res = await api.call("POST", "profiles", data=text)
        _print(args, res, f"stored profile {res['name']} ({res['engine']}, {res['digest']})")
    else:
        data = await api.call("GET", "profiles")
        _print(args, data, "\n".join(f"{p['name']:<16} {p['engine']:<9} {p['kind']:<9} {p['description']}"
                                     for p in data["profiles"]))


async def _credential(args: argparse.Namespace) -> None:
    api = _client(args)
    if args.cred_cmd == "declare":
        res = await api.call("PUT", f"credentials/{args.name}", {"env": args.env})
        _print(args, res, f"credential profile {res['name']} declares {', '.join(res['env'])}")
    elif args.cred_cmd == "set":
        value = sys.stdin.readline().rstrip("\n")
        res = await api.call("PUT", f"credentials/{args.name}/{args.env_name}", {"value": value})
        _print(args, res, f"stored {args.env_name} for credential profile {args.name} (encrypted)")
    else:
        data = await api.call("GET", "credentials")
        _print(args, data, "\n".join(f"{c['name']:<16} {', '.join(c['env'])}" for c in data["credential_profiles"]))


def _human(t: dict) -> str:
    lines = [f"{t['task_id']}  {t['status']}" + (f"  ({t['error']})" if t.get("error") else "")]
    if t.get("result") and t["result"].get("text"):
        lines.append(t["result"]["text"])
    files = t.get("changed_files") or {}
    for kind in ("created", "modified", "deleted"):
        for path in files.get(kind, []):
            lines.append(f"  {kind}: {path}")
    if t.get("waiting_for"):
        lines.append(f"  {t['waiting_for']}")
    if t.get("limits"):
        lines.append(f"  limits: {limits_text(t['limits'])}")
    origin = [f"{label} {t[key]}" for key, label in (("parent_session_id", "session"), ("parent_turn_id", "turn"),
                                                       ("instance_id", "instance"), ("schedule_id", "schedule"),
                                                       ("firing_id", "firing")) if t.get(key)]
    if origin:
        lines.append(f"  from: {', '.join(origin)}")
    return "\n".join(lines)


# ---------------------------------------------------------------- parser

HUB_HELP = f"hub URL (default $AMUX_HUB_URL, else $AMUX_HOME/hub.json, else {DEFAULT_HUB})"
TOKEN_HELP = "API token (default $AMUX_TOKEN, else $AMUX_HOME/admin.token)"
HOME_HELP = "the amux home: database, tokens, hub.json (default $AMUX_HOME, else ./.amux)"


def global_opts(ap: argparse.ArgumentParser) -> None:
    """Add --hub/--home/--token before the subcommand (a subcommand's own copy, when given, wins)."""
    ap.add_argument("--hub", help=HUB_HELP)
    ap.add_argument("--home", help=HOME_HELP)
    ap.add_argument("--token", help=TOKEN_HELP)


def server_opts(p: argparse.ArgumentParser, *, listen: bool = True) -> None:
    """Add the options of a command that opens the database itself (`listen`: one that also serves)."""
    if listen:
        p.add_argument("--listen", help="HOST:PORT (default 127.0.0.1:8787; port 0 picks a free one)")
    p.add_argument("--db", help="database URL (default sqlite in $AMUX_HOME)")
    p.add_argument("--config", help="TOML config file (default $AMUX_HOME/amux.toml)")
    p.add_argument("--home", default=argparse.SUPPRESS, help=HOME_HELP)


def db_opts(p: argparse.ArgumentParser) -> None:
    """Add the options of a command that opens the database but serves nothing (no --listen)."""
    server_opts(p, listen=False)


def client_opts(p: argparse.ArgumentParser) -> None:
    """Add the options of a command that calls a hub over HTTP (unset ones leave the global ones alone)."""
    p.add_argument("--hub", default=argparse.SUPPRESS, help=HUB_HELP)
    p.add_argument("--home", default=argparse.SUPPRESS, help=HOME_HELP)
    p.add_argument("--token", default=argparse.SUPPRESS, help=TOKEN_HELP)
    p.add_argument("--json", action="store_true", help="print JSON")


def _argument(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """An argparse type from a parser that refuses with Invalid (its message names the fix)."""
    def convert(text: str) -> Any:
        try:
            return parse(text)
        except Invalid as e:
            raise argparse.ArgumentTypeError(e.message) from None
    return convert


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


def _add_server_commands(sub: argparse._SubParsersAction) -> None:
    """Add `up`, `hub serve`, `runner` and `db`."""
    up = sub.add_parser("up", help="hub + in-process runner on the embedded database")
    server_opts(up)
    up.add_argument("--slots", type=int, default=8, help="task slots of the in-process runner (default 8)")
    hub = sub.add_parser("hub", help="hub commands")
    hub_sub = hub.add_subparsers(dest="hub_cmd", required=True)
    serve = hub_sub.add_parser("serve", help="hub only (production)")
    server_opts(serve)

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
    run.add_argument("--memory-max", type=_argument(parse_size), metavar="SIZE",
                     help="each task child's memory, its whole process tree (default 4GiB); a profile or task may "
                     "only lower it")
    run.add_argument("--pids-max", type=_argument(_pids), metavar="N",
                     help="each task child's processes and threads (default 1024)")
    run.add_argument("--cpu-max", type=_argument(_cores), metavar="CORES",
                     help="each task child's CPU in cores, e.g. 1.5 (default: this machine's cores less one)")
    run.add_argument("--cgroup-parent", metavar="DIR",
                     help="a cgroup delegated to this runner's user (not root), under which each run gets its own "
                     "group: a cgroup v2 directory, or a path relative to each v1 controller's mount")

    db = sub.add_parser("db", help="database commands")
    db_sub = db.add_subparsers(dest="db_cmd", required=True)
    dbu = db_sub.add_parser("upgrade", help="apply migrations")
    db_opts(dbu)
    from . import cli_recovery
    cli_recovery.add_parser(db_sub, db_opts)


def _add_token_commands(sub: argparse._SubParsersAction) -> None:
    """Add `token create|list|revoke`."""
    tok = sub.add_parser("token", help="API tokens")
    tok_sub = tok.add_subparsers(dest="token_cmd", required=True)
    tc = tok_sub.add_parser("create", help="create a token (shown once)")
    db_opts(tc)
    tc.add_argument("--principal", required=True, help="who the token acts as (created if new)")
    tc.add_argument("--label", help="a name for the token, shown by `amux token list`")
    tc.add_argument("--admin", action="store_true", help="an admin token (with --runner: a shared runner token)")
    tc.add_argument("--runner", action="store_true", help="a runner token: only connects `amux runner` (/runner/ws)")
    tc.add_argument("--kind", default="user", choices=["user", "service", "runtime"], help="the principal's kind")
    tc.add_argument("--json", action="store_true", help="print JSON")
    tl = tok_sub.add_parser("list", help="your tokens (id, kind, label, created, last used, revoked) and live OAuth "
                                         "grants (id, client, scopes, approving token, created)")
    client_opts(tl)
    tl.add_argument("--all", action="store_true", help="every principal's tokens (admin)")
    tr = tok_sub.add_parser("revoke", help="revoke a token and the OAuth grants it approved, or one grant (yours, "
                                           "or anyone's as an admin)")
    client_opts(tr)
    tr.add_argument("id", help="the token id (tok_…) or grant id (og_…), from `amux token list`")


def _add_task_commands(sub: argparse._SubParsersAction) -> None:
    """Add `task …`, `session …` and `instance …`."""
    task = sub.add_parser("task", help="tasks")
    task_sub = task.add_subparsers(dest="task_cmd", required=True)
    ts = task_sub.add_parser("submit", help="submit a task")
    client_opts(ts)
    ts.add_argument("prompt", nargs="?", help="the prompt ('-' or omitted: read stdin)")
    ts.add_argument("--profile", help="launch profile (`amux profile list`)")
    ts.add_argument("--runtime", help="run on this runtime (`amux runtime list`)")
    ts.add_argument("--model", help="the engine's model")
    ts.add_argument("--arg", action="append", help="native engine argument (repeatable)")
    ts.add_argument("--timeout", type=float, help="the task's own timeout in seconds (it ends timed_out)")
    ts.add_argument("--name", help="a name for the task")
    ts.add_argument("--wait", action="store_true", help="follow events until the task ends")
    ts.add_argument("--effort", help="reasoning effort (minimal|low|medium|high|xhigh)")
    ts.add_argument("--policy", help="permission policy (policy-allow|escalate-to-main|deny-all)")
    ts.add_argument("--credential", help="credential profile to materialize at launch")
    ts.add_argument("--isolation", choices=("linux-dac", "userns", "process"),
                    help="execution mode (default: the strongest one a runtime offers)")
    ts.add_argument("--memory-max", metavar="SIZE", help="a lower memory limit than the runner's, e.g. 2GiB")
    ts.add_argument("--pids-max", type=int, metavar="N", help="a lower process and thread limit than the runner's")
    ts.add_argument("--cpu-max", type=float, metavar="CORES", help="a lower CPU limit than the runner's, in cores")
    for name, text in (("get", "show a task"), ("wait", "follow a task's events until it ends"),
                       ("cancel", "cancel a task")):
        p = task_sub.add_parser(name, help=text)
        client_opts(p)
        p.add_argument("id", help="the task id (tr_…)")
        if name == "wait":
            p.add_argument("--timeout", type=float, help="stop waiting after this many seconds (exit 5; the task "
                                                         "goes on)")
    tl = task_sub.add_parser("list", help="your recent tasks")
    client_opts(tl)

    from . import cli_sessions
    cli_sessions.add_parser(sub, client_opts)
    from . import cli_instances
    cli_instances.add_parser(sub, client_opts)


def _add_resource_commands(sub: argparse._SubParsersAction) -> None:
    """Add `memory`, `profile`, `credential`, `schedule`, `alerts` and `identity`."""
    mem = sub.add_parser("memory", help="hub memory of this conversation's scope (for task children)")
    mem_sub = mem.add_subparsers(dest="memory_cmd", required=True)
    for name, text in (("get", "print the value of a key"), ("set", "store a value under a key"),
                       ("delete", "delete a key"), ("list", "list the keys")):
        mp = mem_sub.add_parser(name, help=text)
        client_opts(mp)
        if name != "list":
            mp.add_argument("key", help="the memory key")
        if name == "set":
            mp.add_argument("value", nargs="?", help="the value ('-' or omitted: stdin)")

    prof = sub.add_parser("profile", help="profiles (manifest v2)")
    prof_sub = prof.add_subparsers(dest="profile_cmd", required=True)
    pa = prof_sub.add_parser("add", help="store a v2 manifest (JSON or TOML; admin)")
    client_opts(pa)
    pa.add_argument("file", help="manifest file, or - for stdin")
    client_opts(prof_sub.add_parser("list", help="builtin and stored profiles"))

    cred = sub.add_parser("credential", help="credential profiles")
    cred_sub = cred.add_subparsers(dest="cred_cmd", required=True)
    cd = cred_sub.add_parser("declare", help="declare the variables a launch needs (admin)")
    client_opts(cd)
    cd.add_argument("name", help="the credential profile's name")
    cd.add_argument("--env", action="append", required=True, help="variable name (repeatable)")
    cs = cred_sub.add_parser("set", help="store your value for one variable (read from stdin)")
    client_opts(cs)
    cs.add_argument("name", help="the credential profile's name")
    cs.add_argument("env_name", help="the variable to set (one it declares)")
    client_opts(cred_sub.add_parser("list", help="declared credential profiles"))
    from . import cli_schedules
    cli_schedules.add_parser(sub, client_opts)
    from . import cli_alerts
    cli_alerts.add_parser(sub, client_opts)
    from . import cli_identity
    cli_identity.add_parser(sub, client_opts)
    from . import cli_runtimes
    cli_runtimes.add_parser(sub, client_opts)
    from . import cli_config
    cli_config.add_parser(sub, server_opts)


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
    _add_server_commands(sub)
    _add_token_commands(sub)
    _add_task_commands(sub)
    _add_resource_commands(sub)
    return ap


async def _command(args: argparse.Namespace) -> None:
    """Run the parsed command."""
    if args.cmd in ("up", "hub"):
        await _serve(args, with_runner=args.cmd == "up")
    elif args.cmd == "db" and args.db_cmd == "recover-creators":
        from . import cli_recovery
        await cli_recovery.run(args, _settings(args), _print)
    elif args.cmd == "schedule":
        from . import cli_schedules
        await cli_schedules.run(args, _client(args), _print)
    elif args.cmd in ("alerts", "feishu"):
        from . import cli_alerts
        await cli_alerts.run(args, _client(args), _print)
    elif args.cmd == "session":
        from . import cli_sessions
        await cli_sessions.run(args, _client(args), _print)
    elif args.cmd == "instance":
        from . import cli_instances
        await cli_instances.run(args, _client(args), _print)
    elif args.cmd == "identity":
        from . import cli_identity
        await cli_identity.run(args, _client(args), _print)
    elif args.cmd == "config":
        from . import cli_config
        cli_config.run(args)
    elif args.cmd == "runtime":
        from . import cli_runtimes
        await cli_runtimes.run(args, _client(args), _print)
    else:
        handlers = {"runner": _runner, "db": _db_upgrade, "token": _token, "task": _task,
                    "memory": _memory, "profile": _profile, "credential": _credential}
        await handlers[args.cmd](args)


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
    """Entry point of the `amux` console script; the exit codes are hub/cli_exit.py's (README "Command line")."""
    parser = build_parser()
    _complete(parser)
    args = parser.parse_args(argv)
    if getattr(args, "home", None):
        os.environ["AMUX_HOME"] = args.home  # --home is $AMUX_HOME for this command (config, discovery, tokens)
    from . import logs
    log_settings, log_problem = logs.from_env(os.environ)  # `up` / `hub serve` reconfigure from their settings
    logs.configure(log_settings)
    if log_problem:
        logging.getLogger("amux").warning("%s", log_problem)
    try:
        asyncio.run(_command(args))
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


if __name__ == "__main__":
    sys.exit(main())
