"""`amux instance create|list|followup|send|steer|interrupt|get|wait|archive` over the REST API (instance_* tools)."""
from __future__ import annotations

import argparse
from typing import Any
import asyncio
import sys

from .exit import outcome
from .client import client
from .options import client_opts, emit


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `amux instance …`."""
    ins = subparsers.add_parser("instance", help="persistent Agent Instances")
    sub = ins.add_subparsers(dest="instance_cmd", required=True)
    c = sub.add_parser("create", help="create an instance: identity and permission policy are frozen now")
    client_opts(c)
    c.add_argument("--name", help="a name for the instance")
    c.add_argument("--profile", help="launch profile (`amux profile list`)")
    c.add_argument("--model", help="the engine's model")
    c.add_argument("--effort", dest="reasoning_effort", help="reasoning effort (minimal|low|medium|high|xhigh)")
    c.add_argument("--runtime", help="run on this runtime (`amux runtime list`)")
    c.add_argument("--policy", dest="permission_policy", help="policy-allow | escalate-to-main | deny-all")
    c.add_argument("--arg", dest="extra_args", action="append", help="native engine argument (repeatable)")
    c.add_argument("--prompt", help="start the first run with this prompt ('-': read stdin)")
    c.add_argument("--timeout", dest="timeout_s", type=float, help="the first run's timeout in seconds")
    f = sub.add_parser("followup", help="submit work as the instance's next owner TaskRun")
    client_opts(f)
    f.add_argument("id", help="the instance id (ai_…)")
    f.add_argument("prompt", nargs="?", help="the prompt ('-' or omitted: stdin)")
    for opt in ("--profile", "--engine", "--model", "--runtime"):
        f.add_argument(opt, help="must equal the saved one (omit it to keep the saved identity)")
    f.add_argument("--policy", dest="permission_policy", help="must equal the frozen policy")
    f.add_argument("--timeout", dest="timeout_s", type=float, help="this run's timeout in seconds")
    f.add_argument("--wait", action="store_true", help="wait for the run to end and print the instance")
    for name, text in (("send", "queue mailbox input for the next run"),
                       ("steer", "correct the running turn (else it is queued in the mailbox)")):
        p = sub.add_parser(name, help=text)
        client_opts(p)
        p.add_argument("id", help="the instance id (ai_…)")
        p.add_argument("text", nargs="?", help="the text ('-' or omitted: stdin)")
    ls = sub.add_parser("list", help="your instances, newest first")
    client_opts(ls)
    ls.add_argument("--archived", action="store_true", help="archived instances too")
    ls.add_argument("--limit", type=int, default=50, help="instances to show (1 to 200, default 50)")
    for name, text in (("interrupt", "cancel the current run; the instance stays"), ("get", "show an instance"),
                       ("wait", "wait for the current run (a timeout never cancels it)"),
                       ("archive", "archive an idle instance")):
        p = sub.add_parser(name, help=text)
        client_opts(p)
        p.add_argument("id", help="the instance id (ai_…)")
        if name == "wait":
            p.add_argument("--timeout", type=float, default=30, help="seconds to wait (default 30)")


def _text(value: str | None) -> str:
    return value if value not in (None, "-") else sys.stdin.read()


def _line(i: dict) -> str:
    run = f"  run {i['current_task_id']} {i['current_task_status']}" if i.get("current_task_id") else ""
    task = i.get("task") or {}
    result = (task.get("result") or {}).get("text")
    late = "\n(timed out waiting; the run goes on)" if i.get("timed_out") else ""
    return (f"{i['instance_id']}  {i['status']}  {i['profile']} ({i['engine']}, model={i['model'] or '-'}, "
            f"runtime={i['runtime'] or '-'})  mailbox={i['mailbox_queued']}{run}" + (f"\n{result}" if result else "")
            + late)


async def run(args: argparse.Namespace) -> None:
    """Run one `amux instance` command."""
    api = client(args)
    cmd = args.instance_cmd
    if cmd == "create":
        body = {k: getattr(args, k) for k in ("name", "profile", "model", "reasoning_effort", "runtime",
                                               "permission_policy", "extra_args", "timeout_s")
                if getattr(args, k) is not None}
        if args.prompt is not None:
            body["prompt"] = _text(args.prompt)
        res = await api.call("POST", "instances", body)
        emit(args, res, _line(res) + (f"\nfirst run: {res['task_id']}" if res.get("task_id") else ""))
    elif cmd == "followup":
        body = {k: getattr(args, k) for k in ("profile", "engine", "model", "runtime", "permission_policy",
                                               "timeout_s") if getattr(args, k) is not None}
        res = await api.call("POST", f"instances/{args.id}/followups", {**body, "prompt": _text(args.prompt)})
        if args.wait:
            res = await _wait(api, args.id, None)
            emit(args, res, _line(res))
            _outcome(res)
        else:
            emit(args, res, f"{res['task_id']}  {res['status']}  (mailbox delivered: {res['mailbox_delivered']})")
    elif cmd == "send":
        res = await api.call("POST", f"instances/{args.id}/messages", {"text": _text(args.text)})
        emit(args, res, f"{res['message_id']}  {res['state']}")
    elif cmd == "steer":
        res = await api.call("POST", f"instances/{args.id}/steer", {"text": _text(args.text)})
        emit(args, res, f"{res['delivery']}: {res['note']}")
    elif cmd == "interrupt":
        res = await api.call("POST", f"instances/{args.id}/interrupt")
        emit(args, res, f"{res['task_id']}: {res['task_status']}")
    elif cmd == "get":
        res = await api.call("GET", f"instances/{args.id}")
        emit(args, res, _line(res))
    elif cmd == "list":
        params = {"limit": str(args.limit), **({"archived": "1"} if args.archived else {})}
        res = await api.call("GET", "instances", params=params)
        emit(args, res, "\n".join(_line(i) for i in res["instances"]) or "no instances")
    elif cmd == "wait":
        res = await _wait(api, args.id, args.timeout)
        emit(args, res, _line(res))
        _outcome(res)
    else:
        res = await api.call("POST", f"instances/{args.id}/archive")
        emit(args, res, _line(res))


def _outcome(res: dict) -> None:
    """Exit 1 when the waited run ended other than succeeded, 5 when the wait timed out (README exit codes)."""
    task = res.get("task")
    if task:
        outcome(task["status"], f"instance {res['instance_id']} run {task.get('task_id') or res['current_task_id']}")


async def _wait(api: Any, iid: str, timeout: float | None) -> dict:
    """Wait for the current run in rounds of at most 25 s (`timeout` None: until it ends)."""
    loop = asyncio.get_running_loop()
    deadline = None if timeout is None else loop.time() + timeout
    while True:
        left = 25.0 if deadline is None else max(0.0, min(25.0, deadline - loop.time()))
        res = await api.call("GET", f"instances/{iid}/wait", params={"timeout_s": left})
        if not res.get("timed_out") or (deadline is not None and loop.time() >= deadline):
            return res
