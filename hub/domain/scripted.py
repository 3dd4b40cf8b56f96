"""The `scripted` engine's language: one command a line (deterministic, offline)."""
from __future__ import annotations

import shlex
from dataclasses import dataclass

from ..errors import Invalid

COMMANDS = ("say", "tool", "usage", "write", "sleep", "ask", "fail", "env", "permission", "wait-steer")
EXAMPLE = ("say hello | tool Read 'read a file' | usage input=10 output=5 | write out.txt hi | sleep 0.5 "
           "| ask 'which branch?' | fail REASON")


@dataclass(frozen=True, kw_only=True)
class Step:
    """One parsed script line."""

    op: str
    args: tuple[str, ...]
    text: str = ""
    numbers: tuple[tuple[str, int], ...] = ()
    seconds: float = 0.0


def parse_line(line: str, lineno: int) -> Step | None:
    """Parse one line; blank lines and `#` comments give None."""
    raw = line.strip()
    if not raw or raw.startswith("#"):
        return None
    op, _, rest = raw.partition(" ")
    rest = rest.strip()
    if op not in COMMANDS:
        raise Invalid(f"scripted line {lineno}: unknown command {op!r}; use one of {', '.join(COMMANDS)} "
                      f"(e.g. {EXAMPLE})")
    if op in ("say", "ask", "fail"):
        return Step(op=op, args=(), text=rest)
    if op == "env":
        if not rest or " " in rest:
            raise Invalid(f"scripted line {lineno}: `env NAME` takes one variable name, e.g. env HOME")
        return Step(op=op, args=(rest,))
    if op == "permission":
        parts = _split(rest, lineno)
        if not parts:
            raise Invalid(f"scripted line {lineno}: `permission TOOL TITLE` needs a tool, e.g. permission Bash "
                          "'rm -rf build'")
        return Step(op=op, args=(parts[0], " ".join(parts[1:])))
    if op == "wait-steer":
        try:
            seconds = float(rest or "30")
        except ValueError:
            seconds = -1.0
        if not 0 < seconds <= 3600:
            raise Invalid(f"scripted line {lineno}: `wait-steer [SECONDS]` waits up to SECONDS (default 30) for "
                          "a correction")
        return Step(op=op, args=(), seconds=seconds)
    if op == "tool":
        parts = _split(rest, lineno)
        if not parts:
            raise Invalid(f"scripted line {lineno}: `tool NAME TITLE` needs a name, e.g. tool Read 'read README'")
        return Step(op=op, args=(parts[0], " ".join(parts[1:])))
    if op == "usage":
        nums = []
        for item in _split(rest, lineno):
            key, eq, val = item.partition("=")
            if not eq or not val.isascii() or not val.isdigit():  # `²`.isdigit() is True, int('²') fails
                raise Invalid(f"scripted line {lineno}: `usage` takes key=N pairs with N ≥ 0, e.g. usage "
                              "input=10 output=5")
            nums.append((key, int(val)))
        return Step(op=op, args=(), numbers=tuple(nums))
    if op == "write":
        path, _, text = rest.partition(" ")
        if not path:
            raise Invalid(f"scripted line {lineno}: `write PATH TEXT` needs a path, e.g. write notes.txt hello")
        return Step(op=op, args=(path,), text=text)
    try:
        seconds = float(rest)
    except ValueError:
        seconds = -1.0
    if not 0 <= seconds <= 86400:
        raise Invalid(f"scripted line {lineno}: `sleep SECONDS` takes a number between 0 and 86400, e.g. sleep 0.5")
    return Step(op=op, args=(), seconds=seconds)


def _split(rest: str, lineno: int) -> list[str]:
    try:
        return shlex.split(rest)
    except ValueError as e:
        raise Invalid(f"scripted line {lineno}: {e}; close the quote") from e


def parse(script: str) -> list[Step]:
    """Parse a whole script, refusing it at the first bad line."""
    steps = []
    for n, line in enumerate(script.splitlines(), 1):
        step = parse_line(line, n)
        if step is not None:
            steps.append(step)
    return steps
