"""Durations as a person reads them: `45 s`, `5 min`, `1 h 5 min`, `2 d 3 h`."""
from __future__ import annotations


def readable(seconds: float) -> str:
    """Return `seconds` in its two largest units, rounded down (`0 s` for anything under a second)."""
    total = max(0, int(seconds))
    if total < 60:
        return f"{total} s"
    parts: list[str] = []
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        count, total = divmod(total, size)
        if count or parts:
            parts.append(f"{count} {unit}")
        if len(parts) == 2:
            break
    if parts and parts[-1].startswith("0 "):
        parts.pop()
    return " ".join(parts)
