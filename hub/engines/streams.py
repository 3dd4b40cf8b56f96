"""Small helpers the adapters share when they map a provider stream to canonical events."""
from __future__ import annotations

import os
import shlex
from typing import Any, Mapping

from ..domain.events import clean_usage

_SHELLS = {"bash", "sh", "zsh", "dash"}


def program_name(command: Any) -> str:
    """Return the program a shell command runs (`pytest` for `bash -lc "pytest -q"`), never its arguments."""
    if isinstance(command, list):
        words = [str(w) for w in command]
    else:
        try:
            words = shlex.split(str(command or ""))
        except ValueError:
            words = str(command or "").split()
    if len(words) >= 3 and os.path.basename(words[0]) in _SHELLS and words[1] in ("-c", "-lc"):
        return program_name(words[2])
    while words and "=" in words[0] and not words[0].startswith("="):
        words = words[1:]  # leading VAR=value assignments
    return os.path.basename(words[0]) if words else ""


def tool_title(name: str, args: Any) -> str:
    """Return a short label for a tool call: its stated purpose, the file it touches, or the program it runs.

    Raw input beyond that (command arguments, contents, URLs with their queries) stays off task events.
    """
    if not isinstance(args, Mapping):
        return name
    for key in ("description", "file_path", "notebook_path", "path"):
        if isinstance(args.get(key), str) and args[key].strip():
            return args[key].strip()
    if args.get("command"):
        return program_name(args["command"]) or name
    if isinstance(args.get("pattern"), str):
        return args["pattern"]
    return name


def mapped_usage(raw: Any, names: Mapping[str, str]) -> dict[str, int]:
    """Rename a provider's usage fields to canonical ones and keep only known nonnegative integers."""
    if not isinstance(raw, Mapping):
        return {}
    return clean_usage({names.get(k, k): v for k, v in raw.items()})


def launch_value(snapshot: Mapping[str, Any], key: str) -> str | None:
    """Return a snapshot string that becomes an option value; refuse one an option parser would read as a flag."""
    value = snapshot.get(key)
    if value in (None, ""):
        return None
    value = str(value)
    if value.startswith("-"):
        raise ValueError(f"{key} {value!r} starts with '-' and would be read as an option; fix the {key}")
    return value


def tool_locations(args: Any) -> list[str]:
    """Return the files a tool call names (its `file_path`, `notebook_path` or `path`), for the Agent Timeline."""
    if not isinstance(args, Mapping):
        return []
    return [args[k] for k in ("file_path", "notebook_path", "path") if isinstance(args.get(k), str) and args[k]]


def raw_tool(tool: dict[str, Any], **raw: Any) -> dict[str, Any]:
    """Return a canonical `tool` event payload with the raw fields the provider reported (None and empty dropped).

    `input`, `output`, `diff` and `locations` reach only the Agent Timeline; task events keep id, name, title
    and status (hub.domain.events.project)."""
    return {"tool": {**tool, **{k: v for k, v in raw.items() if v not in (None, "", [], {})}}}
