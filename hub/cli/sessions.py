"""`amux session create | list | get | send | show` over the REST API (a session-ref falls back to AMUX_SESSION_ID)."""
from __future__ import annotations

import argparse
from typing import Any
import asyncio
import os
import sys

from .exit import UsageError, outcome
from ..domain.durations import duration_text
from .client import client
from .options import client_opts, emit


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Add `amux session …`."""
    ses = subparsers.add_parser("session", help="interactive sessions")
    sub = ses.add_subparsers(dest="session_cmd", required=True)
    sc = sub.add_parser("create", help="create a session")
    client_opts(sc)
    for opt, text in (("--name", "a name to refer to it by (unique among yours)"),
                      ("--profile", "launch profile (`amux profile list`)"), ("--model", "the engine's model"),
                      ("--effort", "reasoning effort (minimal|low|medium|high|xhigh)"),
                      ("--runtime", "run its Turns on this runtime (`amux runtime list`)")):
        sc.add_argument(opt, help=text)
    ls = sub.add_parser("list", help="your sessions, most recently updated first")
    client_opts(ls)
    ls.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    ss = sub.add_parser("send", help="send a message (a Turn) into one of your sessions")
    client_opts(ss)
    ss.add_argument("ref", nargs="?", help="session id or name (default $AMUX_SESSION_ID)")
    ss.add_argument("text", nargs="?", help="the message ('-' or omitted: stdin)")
    ss.add_argument("--no-wait", action="store_true", help="return once the turn is queued")
    ss.add_argument("--timeout", type=float, default=600, help="seconds to wait for the outcome (default 600)")
    for name, text in (("get", "a session and its recent turns"), ("show", "the same as get")):
        p = sub.add_parser(name, help=text)
        client_opts(p)
        p.add_argument("ref", nargs="?", help="session id or name (default $AMUX_SESSION_ID)")


def session_ref(args: argparse.Namespace) -> str:
    """Return the session-ref given, else $AMUX_SESSION_ID; refuse naming the fix when there is neither."""
    ref = getattr(args, "ref", None) or os.environ.get("AMUX_SESSION_ID")
    if not ref:
        raise UsageError("no session-ref: pass a session id or name (`amux session list` shows yours), "
                        "or set AMUX_SESSION_ID")
    return ref


def _line(s: dict) -> str:
    return (f"{s['session_id']}  {s['name'] or '-':<20} {s['kind']:<11} {s['engine']:<9} model={s['model'] or '-'}  "
            f"runtime={s['runtime'] or '-'}  turns={s['turns']}  updated {(s['updated_at'] or '-')[:19]}")


async def run(args: argparse.Namespace) -> None:
    """Run one `amux session` command."""
    api = client(args)
    if args.session_cmd == "create":
        body = {k: v for k, v in {"name": args.name, "profile": args.profile, "model": args.model,
                                  "reasoning_effort": args.effort, "runtime": args.runtime}.items() if v is not None}
        res = await api.call("POST", "sessions", body)
        emit(args, res, f"{res['session_id']}  {res['engine']}  {res['model'] or '(engine default model)'}")
    elif args.session_cmd == "list":
        res = await api.call("GET", "sessions", params={"limit": args.limit})
        emit(args, res, "\n".join(_line(s) for s in res["sessions"])
             or "no sessions; create one with `amux session create --name NAME --profile P`")
    elif args.session_cmd == "send":
        if args.text is None and os.environ.get("AMUX_SESSION_ID"):
            args.ref, args.text = None, args.ref  # `amux session send TEXT` inside a session
        text = args.text if args.text not in (None, "-") else sys.stdin.read()
        res = await api.call("POST", f"sessions/{session_ref(args)}/turns", {"text": text, "wait": False})
        if not args.no_wait:
            res = await _follow(api, res, args.timeout)
        emit(args, res, (res.get("result") or {}).get("text") or f"{res.get('turn_id')}  {res.get('status')}")
        if not args.no_wait:
            outcome(res["status"], f"turn {res['turn_id']}")
    else:
        res = await api.call("GET", f"sessions/{session_ref(args)}")
        lines = [f"{res['session_id']}  {res['name'] or ''}  {res['engine']}  model={res['model']}  "
                 f"runtime={res['runtime']}"]
        lines += [f"  #{t['seq']} {t['id']} {t['status']}  {(t['result'] or '')[:80]}" for t in res["turns"]]
        q = res.get("question")
        if q:  # the last Turn ended on the agent's question: the next Turn answers it
            lines += [f"  waiting for your answer ({q['question_id']}, turn {q['turn_id']}): {q['text']}"]
            lines += [f"    options: {' | '.join(q['options'])}"] if q["options"] else []
            lines += [f"    answer with `amux session send {res['session_id']} TEXT`"]
        emit(args, res, "\n".join(lines))


PROGRESS_EVERY_S = 10.0


async def _follow(api: Any, queued: dict, timeout: float | None) -> dict:
    """Poll a queued Turn until it is terminal or `timeout` elapses, saying on stderr what it is doing."""
    from ..domain.tasks import is_terminal

    loop = asyncio.get_running_loop()
    start = loop.time()
    turn_id, said, last = queued["turn_id"], None, start
    print(f"turn {turn_id} queued in session {queued['session_id']}; waiting for its outcome (--no-wait returns "
          "at once)", file=sys.stderr, flush=True)
    while True:
        view = await api.call("GET", f"turns/{turn_id}")
        now = loop.time()
        if is_terminal(view["status"]) or (timeout is not None and now - start >= timeout):
            print(f"turn {turn_id} {view['status']} after {duration_text(round(now - start))}", file=sys.stderr,
                  flush=True)
            return view
        if view["status"] != said or now - last >= PROGRESS_EVERY_S:
            print(f"turn {turn_id} {view['status']} ({duration_text(round(now - start))})", file=sys.stderr, flush=True)
            said, last = view["status"], now
        left = None if timeout is None else timeout - (now - start)
        await asyncio.sleep(min(1.0, left) if left is not None else 1.0)
