"""`amux schedule create <session-ref> …|update ID …|list|get|notify|pause|resume|run-now|delete|history` over
the REST API."""
from __future__ import annotations

import argparse
import os
import sys

from .client import client
from .options import client_opts, emit


UPDATE_CHOICES = (("--profile", "profile"), ("--runtime", "runtime"), ("--model", "model"),
                  ("--effort", "reasoning_effort"), ("--policy", "permission_policy"),
                  ("--credential", "credential_profile"))
UPDATE_FIELDS = ("name", "prompt", "rule", "timezone", "session_ref", "timeout_s", "extra_args", "notify",
                 "overlap") + tuple(
    dest for _, dest in UPDATE_CHOICES)
OVERLAP = ["allow", "skip", "replace"]
OVERLAP_HELP = ("subtask schedules: a fire while the previous Task is unfinished — allow (default) admits anyway, "
                "skip admits nothing, replace cancels it then admits")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `amux schedule …`."""
    sch = subparsers.add_parser("schedule", help="durable schedules")
    sub = sch.add_subparsers(dest="schedule_cmd", required=True)
    c = sub.add_parser("create", help="create a schedule (session-prompt into <session-ref> by default)")
    client_opts(c)
    c.add_argument("session_ref", nargs="?",
                   help="session id or name (default $AMUX_SESSION_ID); omit with --type subtask")
    c.add_argument("--rule", required=True,
                   help='"*/5 * * * *" | "@daily" (@hourly @weekly @monthly @yearly) | "every 30s|5m|2h" | '
                        '"at 2026-12-01T09:00:00+08:00"')
    c.add_argument("--prompt", help="what each firing asks ('-' or omitted: read stdin)")
    c.add_argument("--name", help="a name for the schedule")
    c.add_argument("--tz", dest="timezone", help="IANA timezone (default: the hub's)")
    c.add_argument("--type", dest="schedule_type", choices=["session-prompt", "subtask"], default="session-prompt",
                   help="session-prompt (default): a Turn into the session; subtask: a Task of its own")
    c.add_argument("--profile", help="launch profile of each firing (subtask)")
    c.add_argument("--runtime", help="run each firing on this runtime")
    c.add_argument("--model", help="the engine's model")
    c.add_argument("--effort", dest="reasoning_effort", help="reasoning effort (minimal|low|medium|high|xhigh)")
    c.add_argument("--policy", dest="permission_policy", help="policy-allow | escalate-to-main | deny-all")
    c.add_argument("--credential", dest="credential_profile", help="credential profile to materialize at launch")
    c.add_argument("--timeout", dest="timeout_s", type=float, help="each firing's timeout in seconds")
    c.add_argument("--arg", dest="extra_args", action="append", help="native engine argument (repeatable)")
    c.add_argument("--notify", choices=["failures", "all", "none"],
                   help="which outcomes reach the Feishu administrator (default failures)")
    c.add_argument("--overlap", choices=OVERLAP, help=OVERLAP_HELP)
    up = sub.add_parser("update", help="change given fields of a schedule (\"\" clears an execution choice)")
    client_opts(up)
    up.add_argument("id", help="the schedule id (sch_…)")
    up.add_argument("--name", help="a new name")
    up.add_argument("--prompt", help="what each firing asks ('-': read stdin)")
    up.add_argument("--rule", help="a new rule restarts the schedule from now")
    up.add_argument("--tz", dest="timezone", help="IANA timezone")
    up.add_argument("--session", dest="session_ref", help="session id or name (session-prompt schedules)")
    for opt, dest in UPDATE_CHOICES:
        up.add_argument(opt, dest=dest, help='"" clears it back to the default resolved at each fire')
    up.add_argument("--timeout", dest="timeout_s", type=float, help="each firing's timeout in seconds")
    up.add_argument("--arg", dest="extra_args", action="append",
                    help="native engine argument, repeatable (replaces the saved ones)")
    up.add_argument("--notify", choices=["failures", "all", "none"],
                    help="which outcomes reach the Feishu administrator")
    up.add_argument("--overlap", choices=OVERLAP, help=OVERLAP_HELP)
    nt = sub.add_parser("notify", help="choose which outcomes reach the Feishu administrator")
    client_opts(nt)
    nt.add_argument("id", help="the schedule id (sch_…)")
    nt.add_argument("mode", choices=["failures", "all", "none"], help="failures (default) | all | none")
    ls = sub.add_parser("list", help="your schedules")
    client_opts(ls)
    rn = sub.add_parser("run-now", help="fire a schedule once now (a manual firing; the next fire time stays)")
    client_opts(rn)
    rn.add_argument("id", help="the schedule id (sch_…)")
    for name, text in (("get", "show a schedule"), ("pause", "pause a schedule (no firing until resumed)"),
                       ("resume", "resume a paused schedule"), ("delete", "delete a schedule"),
                       ("history", "a schedule's firings, oldest first")):
        p = sub.add_parser(name, help=text)
        client_opts(p)
        p.add_argument("id", help="the schedule id (sch_…)")
        if name == "history":
            p.add_argument("--cursor", type=int, default=0, help="start after this firing (from `(more: …)`)")
            p.add_argument("--limit", type=int, default=50, help="firings per page (default 50)")


def _line(s: dict) -> str:
    state = "paused" if s["paused"] else ("consumed" if s["consumed"] else f"next {s['next_fire_at']}")
    overlap = f"  overlap={s['overlap']}" if s.get("overlap", "allow") != "allow" else ""
    return (f"{s['schedule_id']}  {s['schedule_type']:<14} {s['rule']!r:<22} {s['timezone']:<16} {state}  {s['name']}"
            + overlap)


async def run(args: argparse.Namespace) -> None:
    """Run one `amux schedule` command."""
    api = client(args)
    if args.schedule_cmd == "create":
        prompt = args.prompt
        if prompt in (None, "-"):
            prompt = sys.stdin.read()
        body = {k: getattr(args, k) for k in ("rule", "name", "timezone", "schedule_type", "profile", "runtime",
                                              "model",
                                               "reasoning_effort", "permission_policy", "credential_profile",
                                               "timeout_s", "extra_args", "notify", "overlap")
                if getattr(args, k) is not None}
        body["prompt"] = prompt
        if args.schedule_type == "session-prompt":
            body["session_ref"] = args.session_ref or os.environ.get("AMUX_SESSION_ID")
        elif args.session_ref:
            body["session_ref"] = args.session_ref
        s = await api.call("POST", "schedules", {**body, "source": "cli"})
        emit(args, s, _line(s))
    elif args.schedule_cmd == "update":
        body = {k: getattr(args, k) for k in UPDATE_FIELDS if getattr(args, k) is not None}
        if body.get("prompt") == "-":
            body["prompt"] = sys.stdin.read()
        s = await api.call("PATCH", f"schedules/{args.id}", body)
        emit(args, s, _line(s))
    elif args.schedule_cmd == "list":
        data = await api.call("GET", "schedules")
        emit(args, data, "\n".join(_line(s) for s in data["schedules"]) or "no schedules")
    elif args.schedule_cmd == "get":
        s = await api.call("GET", f"schedules/{args.id}")
        notices = s.get("notifications") or {}
        emit(args, s, _line(s) + (f"\n  notifications: {notices['why']}" if notices.get("why") else ""))
    elif args.schedule_cmd == "notify":
        s = await api.call("PATCH", f"schedules/{args.id}", {"notify": args.mode})
        emit(args, s, f"{s['schedule_id']}: notify {s['notify']}")
    elif args.schedule_cmd in ("pause", "resume"):
        s = await api.call("POST", f"schedules/{args.id}/{args.schedule_cmd}")
        emit(args, s, _line(s))
    elif args.schedule_cmd == "run-now":
        f = await api.call("POST", f"schedules/{args.id}/run-now")
        emit(args, f, f"{args.id}: manual firing {f['firing_id']}  {f['receipt'] or 'no dispatch recorded'}")
    elif args.schedule_cmd == "delete":
        s = await api.call("DELETE", f"schedules/{args.id}")
        emit(args, s, f"{s['schedule_id']} deleted (admitted tasks keep running)")
    elif args.schedule_cmd == "history":
        h = await api.call("GET", f"schedules/{args.id}/history", params={"cursor": args.cursor, "limit": args.limit})
        lines = [f"{f['nominal_time']}  {f['receipt'] or 'no dispatch recorded'}  outcome={f['outcome'] or '-'}"
                 + (f" ×{f['missed_count']}" if f["missed_count"] > 1 else "") for f in h["firings"]]
        if h["next_cursor"] is not None:
            lines.append(f"(more: --cursor {h['next_cursor']})")
        emit(args, h, "\n".join(lines) or "no firings yet")
