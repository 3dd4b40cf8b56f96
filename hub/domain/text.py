"""Text every store can keep, and JSON of bounded depth: checked at every door before anything else runs.

SQLite and PostgreSQL must answer the same input the same way: PostgreSQL cannot store a NUL byte in
text, neither store can encode an unpaired UTF-16 surrogate, and a deeply nested body costs the
parser's recursion before anything useful happens.
"""
from __future__ import annotations

import json
from typing import Any

MAX_DEPTH = 32


class BadText(ValueError):
    """A field holds text no store can keep; `str()` names the field and the fix."""


def check_text(value: str, where: str) -> None:
    """Refuse NUL bytes and unpaired surrogates, naming `where`."""
    if "\x00" in value:
        raise BadText(f"{where} contains a NUL byte (\\u0000), which cannot be stored; remove it")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise BadText(f"{where} contains an unpaired UTF-16 surrogate at position {e.start}; "
                      "send valid Unicode text") from None


def check_value(value: Any, where: str = "body", depth: int = 0) -> None:
    """Walk a decoded JSON value: bounded depth, storable text in every key and string."""
    if depth > MAX_DEPTH:
        raise BadText(f"{where} is nested more than {MAX_DEPTH} levels deep; flatten it")
    if isinstance(value, str):
        check_text(value, where)
    elif isinstance(value, dict):
        for k, v in value.items():
            check_text(k, f"a key of {where}")
            check_value(v, f"{where}.{k}" if where not in ("body", "argument") else f"`{k}`", depth + 1)
    elif isinstance(value, list):
        for i, v in enumerate(value):
            check_value(v, f"{where}[{i}]", depth + 1)
    elif isinstance(value, float) and value != value:  # NaN
        raise BadText(f"{where} is NaN; send a number")


def check_depth(value: Any, depth: int = 0) -> None:
    """Refuse a decoded JSON value nested more than MAX_DEPTH levels deep (its text is not looked at)."""
    if depth > MAX_DEPTH:
        raise BadText(f"body is nested more than {MAX_DEPTH} levels deep; flatten it")
    if isinstance(value, dict):
        for v in value.values():
            check_depth(v, depth + 1)
    elif isinstance(value, list):
        for v in value:
            check_depth(v, depth + 1)


def loads_bounded(raw: bytes | str) -> Any:
    """Decode JSON of bounded depth, whatever text it holds (raises BadText): the rule of every door."""
    try:
        value = json.loads(raw)
    except RecursionError:
        raise BadText(f"body is nested more than {MAX_DEPTH} levels deep; flatten it") from None
    except (ValueError, UnicodeDecodeError) as e:
        raise BadText(f"body is not valid JSON ({e}); send a JSON object") from None
    check_depth(value)
    return value


def loads(raw: bytes | str) -> Any:
    """Decode JSON of bounded depth, refusing text no store can keep (raises BadText)."""
    value = loads_bounded(raw)
    check_value(value)
    return value
