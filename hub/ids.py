"""Sortable prefixed identifiers (`tr_…`, `ai_…`, `task_…`)."""
from __future__ import annotations

import secrets
import time

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"  # Crockford base32, lower case


def _b32(n: int, width: int) -> str:
    out = []
    for _ in range(width):
        n, r = divmod(n, 32)
        out.append(_ALPHABET[r])
    return "".join(reversed(out))


def new_id(prefix: str, random_chars: int = 10) -> str:
    """Return `prefix_` + a millisecond timestamp + random characters (sorts by creation)."""
    ms = int(time.time() * 1000)
    rnd = secrets.randbits(5 * random_chars)
    return f"{prefix}_{_b32(ms, 9)}{_b32(rnd, random_chars)}"


def short_id(prefix: str, chars: int = 8) -> str:
    """Return a short random id for people to read in a list (`task_k3v9q2mx`)."""
    return f"{prefix}_{_b32(secrets.randbits(5 * chars), chars)}"
