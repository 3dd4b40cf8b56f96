"""Builtin shortcut profiles (stored manifest-v2 profiles: hub/services/tasks/profiles.py; launch presets: config)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class Profile:
    """A builtin shortcut: a name for an engine; launch choices come from presets, never from the profile."""

    name: str
    engine: str
    kind: str = "builtin"
    description: str = ""

    def digest(self) -> str:
        """Return a content digest frozen into snapshots."""
        body = json.dumps(asdict(self), sort_keys=True).encode()
        return "sha256:" + hashlib.sha256(body).hexdigest()[:32]

    def public(self) -> dict:
        """Return the listing shape."""
        return {"name": self.name, "engine": self.engine, "kind": self.kind, "description": self.description,
                "digest": self.digest()}


BUILTINS: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("claude", "claude", description="Claude Code CLI"),
        Profile("codex", "codex", description="OpenAI Codex CLI"),
        Profile("pi", "pi", description="Pi coding agent"),
        Profile("scripted", "scripted",
                description="Deterministic scripted engine for tests and demos; the prompt is the script"),
    )
}
