"""Fake `codex app-server`: JSON-RPC over stdio as codex-cli 0.171 speaks it, for the escalate-to-main adapter.

Sources: openai/codex codex-rs/app-server-protocol (v2), as the installed CLI prints it with
`codex app-server generate-json-schema --out DIR` (ClientRequest / ServerRequest / ServerNotification,
ThreadStartParams, TurnStartParams, CommandExecutionRequestApprovalParams and …Response,
FileChangeRequestApprovalParams, ToolRequestUserInputParams, ThreadTokenUsageUpdatedNotification,
TurnCompletedNotification, ErrorNotification), and a session recorded against the real 0.171 binary
(initialize → thread/start → turn/start, then `error` {message, additionalDetails, willRetry} and
`turn/completed`). Messages carry no "jsonrpc" member, one JSON object per line.

It checks every request the adapter sends (method order, required params, enum values), answers the
handshake, then replays streams/codex-app-server/$FAKE_SCENARIO.jsonl. Stage directions:
    {"_fake": "await_decision", "id": N, "accept": S1, "decline": S2}  read the client's response to server
        request N; a v2 {"decision": "accept"} (or v1 "approved") plays S1, "decline"/"denied" plays S2
    {"_fake": "await_reply", "id": N}  read and record the client's response to server request N
    {"_fake": "await_steer"}  read a `turn/steer` request (TurnSteerParams: threadId, input, expectedTurnId) and
        answer {"turnId"} when it names the running turn, else the error codex answers
    {"_fake": "answer_steer"}  the turn takes the correction: a userMessage item and an agentMessage naming it
plus the shared ones (sleep, exit, …). Then it reads stdin to EOF, as the real server does.
"""
from __future__ import annotations

import json
import os
import sys

import fakecli

ENGINE = "codex-app-server"
THREAD = "019ac0de-0000-7000-8000-00000000a001"
TURN = "019ac0de-0000-7000-8000-00000000b001"
APPROVALS = ("untrusted", "on-request", "never")
SANDBOXES = ("read-only", "workspace-write", "danger-full-access")
EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh")
ACCEPT = ("accept", "acceptForSession", "approved", "approved_for_session")
DECLINE = ("decline", "cancel", "denied", "abort")


def fail(message: str) -> None:
    """Refuse like the real server would: an error on stderr and exit 1."""
    sys.stderr.write(f"fake app-server: {message}\n")
    sys.exit(1)


def send(msg: dict) -> None:
    sys.stdout.write(json.dumps(msg) + "\n")
    sys.stdout.flush()


def receive() -> dict:
    line = sys.stdin.readline()
    if not line:
        fail("stdin closed while waiting for the client")
    msg = json.loads(line)
    fakecli.record("stdin.jsonl", msg)
    if "jsonrpc" in msg:
        fail("the app server's messages carry no jsonrpc member")
    return msg


def request(method: str | tuple[str, ...]) -> dict:
    msg = receive()
    methods = (method,) if isinstance(method, str) else method
    if msg.get("method") not in methods or "id" not in msg:
        fail(f"expected a {' or '.join(methods)} request, got {msg}")
    if not isinstance(msg.get("params"), dict):
        fail(f"{msg['method']} needs params")
    return msg


def check_argv(argv: list[str]) -> None:
    i = 0
    while i < len(argv):
        if argv[i] in ("-c", "--config", "--enable", "--disable") and i + 1 < len(argv):
            if argv[i] in ("-c", "--config") and "=" not in argv[i + 1]:
                fakecli.usage_error(f"-c expects key=value, got {argv[i + 1]!r}")
            i += 2
        else:
            fakecli.usage_error(f"app-server does not take {argv[i]!r}")


def handshake() -> None:
    init = request("initialize")
    info = init["params"].get("clientInfo") or {}
    if not isinstance(info.get("name"), str) or not isinstance(info.get("version"), str):
        fail("initialize needs clientInfo.name and clientInfo.version")
    send({"id": init["id"], "result": {"userAgent": f"{info['name']}/0.171.0 (fake)", "codexHome": "/fake/codex-home",
                                       "platformFamily": "unix", "platformOs": "linux"}})
    note = receive()
    if note != {"method": "initialized"}:
        fail(f"expected the initialized notification, got {note}")
    start = request(("thread/start", "thread/resume"))
    params = start["params"]
    fakecli.record("thread.json", {"method": start["method"], "params": params})
    if not os.path.isabs(str(params.get("cwd") or "")):
        fail("thread cwd must be an absolute path")
    if params.get("approvalPolicy") not in (None, *APPROVALS):
        fail(f"invalid approvalPolicy {params.get('approvalPolicy')!r}")
    if params.get("sandbox") not in (None, *SANDBOXES):
        fail(f"invalid sandbox {params.get('sandbox')!r}")
    thread_id = params["threadId"] if start["method"] == "thread/resume" else THREAD
    if start["method"] == "thread/resume" and not isinstance(thread_id, str):
        fail("thread/resume needs threadId")
    thread = {"id": thread_id, "cwd": params["cwd"], "modelProvider": "openai", "status": {"type": "idle"},
              "turns": [], "cliVersion": "0.171.0", "ephemeral": False, "preview": ""}
    send({"id": start["id"], "result": {"thread": thread, "model": params.get("model") or "gpt-5.1-codex",
                                        "modelProvider": "openai", "cwd": params["cwd"], "approvalsReviewer": "user",
                                        "approvalPolicy": params.get("approvalPolicy") or "on-request",
                                        "sandbox": {"type": "dangerFullAccess"}}})
    send({"method": "thread/started", "params": {"thread": thread}})
    turn = request("turn/start")
    tp = turn["params"]
    texts = [i.get("text") for i in tp.get("input") or [] if isinstance(i, dict) and i.get("type") == "text"]
    if tp.get("threadId") != thread_id or not texts or not all(isinstance(t, str) and t for t in texts):
        fail(f"turn/start needs this thread's id and text input, got {tp}")
    if tp.get("effort") not in (None, *EFFORTS):
        fail(f"invalid effort {tp.get('effort')!r}")
    fakecli.record("prompt.json", "\n".join(texts))
    fakecli.record("turn.json", tp)
    started = {"id": TURN, "items": [], "status": "inProgress", "error": None}
    send({"id": turn["id"], "result": {"turn": started}})
    send({"method": "turn/started", "params": {"threadId": thread_id, "turn": started}})


def directive(d: dict) -> None:
    if d["_fake"] == "await_decision":
        reply = receive()
        decision = (reply.get("result") or {}).get("decision") if reply.get("id") == d["id"] else None
        if decision in ACCEPT:
            fakecli.play(ENGINE, d["accept"], directive)
        elif decision in DECLINE:
            fakecli.play(ENGINE, d["decline"], directive)
        else:
            fail(f"expected a decision for server request {d['id']}, got {reply}")
    elif d["_fake"] == "await_reply":
        reply = receive()
        if reply.get("id") != d["id"] or not ("result" in reply or "error" in reply):
            fail(f"expected the reply to server request {d['id']}, got {reply}")
        fakecli.record("replies.jsonl", reply)
    elif d["_fake"] == "await_steer":
        steer = request("turn/steer")
        sp = steer["params"]
        texts = [i.get("text") for i in sp.get("input") or [] if isinstance(i, dict) and i.get("type") == "text"]
        if sp.get("threadId") != THREAD or not texts:
            fail(f"turn/steer needs this thread's id and text input, got {sp}")
        if sp.get("expectedTurnId") != TURN:
            wrong = f"expected active turn id {sp.get('expectedTurnId')} but found {TURN}"
            send({"id": steer["id"], "error": {"code": -32600, "message": wrong}})
            return
        STEERED["text"] = "\n".join(texts)
        send({"id": steer["id"], "result": {"turnId": TURN}})
    elif d["_fake"] == "answer_steer":
        ids = {"threadId": THREAD, "turnId": TURN}
        user = {"type": "userMessage", "id": "item_u2", "content": [{"type": "text", "text": STEERED.get("text", ""),
                                                                      "text_elements": []}]}
        send({"method": "item/completed", "params": {"item": user, **ids}})
        answer = {"type": "agentMessage", "id": "item_a2", "text": f"Changing course: {STEERED.get('text', '')}"}
        send({"method": "item/completed", "params": {"item": answer, **ids}})
    else:
        fakecli.usage_error(f"directive {d['_fake']!r} is not known to the app-server fake")


STEERED: dict[str, str] = {}


def main(argv: list[str]) -> None:
    """Serve one client on stdio."""
    scenario = fakecli.start(ENGINE)
    check_argv(argv)
    handshake()
    fakecli.play(ENGINE, scenario, directive)
    for line in sys.stdin:  # like the real server: serve until the client closes stdin
        fakecli.record("stdin.jsonl", json.loads(line))
