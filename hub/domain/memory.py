"""Memory scopes (seed: child Sessions use the same Hub memory model as interactive Sessions)."""
from __future__ import annotations

GLOBAL = "global"
NONE = "none"  # capability discovery failed: this conversation has no amux memory (never a global fallback)
PENDING = "pending:"


def scope_for(principal_id: str, user_isolation: bool) -> str:
    """The scope a fresh execution resolves with its effective launch principal."""
    return f"principal:{principal_id}" if user_isolation else GLOBAL


def precondition(principal_id: str, user_isolation: bool) -> str:
    """The scope precondition a fresh session stores at creation, independent of its Profile."""
    return PENDING + scope_for(principal_id, user_isolation)


def bind(stored: str | None, runtime_has_memory: bool) -> tuple[str, bool]:
    """Bind at the first launch; an existing binding is kept on resume. Return (scope, warn)."""
    if stored is None or not stored.startswith(PENDING):
        return stored or NONE, False
    if not runtime_has_memory:
        return NONE, True
    return stored[len(PENDING):], False
