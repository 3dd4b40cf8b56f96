"""`amux task submit | get | wait | cancel | list` over the REST API; `wait` follows a task's events to its end."""
from __future__ import annotations

import argparse
import asyncio
import json
import sys

from ..domain.limits import limits_text
from .client import ApiClient, client
from .exit import outcome
from .options import client_opts, emit

WAIT_REASON_POLL_S = 2.0  # a task still queued after this is said to wait, and why; reread as often


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Add `task …`."""
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


async def run(args: argparse.Namespace) -> None:
    """Run one `amux task` command."""
    api = client(args)
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
            emit(args, sub, sub["task_id"])
            return
        args.id = sub["task_id"]
        args.timeout = None
        await _wait(args, api)
    elif args.task_cmd == "get":
        t = await api.call("GET", f"tasks/{args.id}")
        emit(args, t, _human(t))
    elif args.task_cmd == "wait":
        await _wait(args, api)
    elif args.task_cmd == "cancel":
        t = await api.call("POST", f"tasks/{args.id}/cancel")
        emit(args, t, f"{t['task_id']}: {t['status']}")
    elif args.task_cmd == "list":
        data = await api.call("GET", "tasks")
        emit(args, data, "\n".join(f"{t['task_id']}  {t['status']:<10} {t['name'] or ''}" for t in data["tasks"]))


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
    emit(args, t, _human(t))
    outcome(t["status"], f"task {t['task_id']}")


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
