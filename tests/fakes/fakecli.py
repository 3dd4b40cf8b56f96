"""What the fake CLIs share: record what they received, replay a recorded stream, act out directives.

A stream file (`streams/<engine>/<scenario>.jsonl`) holds lines exactly as the real CLI prints them.
Lines that are JSON objects with a `_fake` key are not printed; they are stage directions:
    {"_fake": "sleep", "seconds": N}          pause (the `slow` and question scenarios are only ever cut short)
    {"_fake": "exit", "code": N, "stderr": S}  write S to stderr and exit with N
    {"_fake": "close_stdin"}                   close our end of stdin (a reply can no longer be delivered)
    {"_fake": "spawn_grandchild"}              start `sleep 60` in our process group and record its pid
    {"_fake": "<engine-specific>", …}          handed to the fake's own handler (e.g. awaiting a reply)
Everything a fake receives is written to $FAKE_RECORD_DIR (argv.json, stdin.jsonl, env.json, environ.json, pids).
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

STREAMS = Path(__file__).resolve().parent / "streams"


def usage_error(message: str) -> None:
    """Refuse argv the real CLI would not get from amux: print why and exit 64 (EX_USAGE)."""
    sys.stderr.write(f"fake: unexpected argv: {message}\nargv: {sys.argv[1:]}\n")
    sys.exit(64)


def record(name: str, data) -> None:
    """Write one thing the fake received into the record directory, if the test gave one."""
    folder = os.environ.get("FAKE_RECORD_DIR")
    if not folder:
        return
    path = Path(folder) / name
    if name.endswith(".jsonl"):
        with path.open("a") as f:
            f.write(json.dumps(data) + "\n")
    else:
        path.write_text(json.dumps(data))


def start(engine: str) -> str:
    """Record argv, pid and the policy env; return the scenario name."""
    record("argv.json", sys.argv[1:])
    record("pid.json", os.getpid())
    record("env.json", {k: os.environ[k] for k in ("IS_SANDBOX",) if k in os.environ})
    record("environ.json", dict(os.environ))  # the whole environment the launch gave us (trust-boundary tests)
    scenario = os.environ.get("FAKE_SCENARIO", "success")
    if not (STREAMS / engine / f"{scenario}.jsonl").exists():
        usage_error(f"no recorded {engine} stream named {scenario!r}")
    return scenario


def play(engine: str, scenario: str, handle: Callable[[dict], None] | None = None,
         skip: Callable[[dict], bool] | None = None) -> None:
    """Print a recorded stream line by line, acting out its directives (lines `skip` names are not printed)."""
    for line in (STREAMS / engine / f"{scenario}.jsonl").read_text().splitlines():
        try:
            msg = json.loads(line)
        except ValueError:
            msg = None
        if skip is not None and isinstance(msg, dict) and skip(msg):
            continue
        if not (isinstance(msg, dict) and "_fake" in msg):
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
            continue
        kind = msg["_fake"]
        if kind == "sleep":
            time.sleep(float(msg["seconds"]))
        elif kind == "exit":
            sys.stdout.flush()
            sys.stderr.write(msg.get("stderr", "") + "\n")
            sys.stderr.flush()
            os._exit(int(msg["code"]))
        elif kind == "close_stdin":
            sys.stdin.close()
            os.close(0)
        elif kind == "spawn_grandchild":
            child = subprocess.Popen(["sleep", "60"])
            record("grandchild.json", child.pid)
        elif handle is not None:
            handle(msg)
        else:
            usage_error(f"directive {kind!r} is not known to the {engine} fake")


def options(argv: list[str], spec: dict[str, str]) -> list[tuple[str, str | None]]:
    """Parse `--name value`, `--name=value` and flags by `spec` (name → "flag" | "value" | "variadic").

    Returns the (name, value) pairs in order; anything not in `spec` is a usage error.
    """
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(argv):
        arg = argv[i]
        name, _, attached = arg.partition("=") if arg.startswith("--") else (arg, "", "")
        kind = spec.get(name)
        if kind is None:
            usage_error(f"unknown option {arg!r}")
        if kind == "flag":
            out.append((name, None))
            i += 1
        elif attached or "=" in arg and arg.startswith("--"):
            out.append((name, attached))
            i += 1
        elif kind == "variadic":
            j = i + 1
            while j < len(argv) and not argv[j].startswith("-"):
                out.append((name, argv[j]))
                j += 1
            if j == i + 1:
                usage_error(f"{name} needs a value")
            i = j
        else:
            if i + 1 >= len(argv) or argv[i + 1].startswith("-"):
                usage_error(f"{name} needs a value")
            out.append((name, argv[i + 1]))
            i += 2
    return out


def require_choice(name: str, value: str | None, choices: tuple[str, ...]) -> None:
    """Refuse a value the real CLI would reject."""
    if value not in choices:
        sys.stderr.write(f"error: invalid value {value!r} for {name} (possible values: {', '.join(choices)})\n")
        sys.exit(2)
