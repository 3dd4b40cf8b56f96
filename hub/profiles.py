"""Profiles: builtin shortcuts with their launch presets (manifest v2 profiles come with the engines work)."""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field

from .errors import Invalid


@dataclass(frozen=True)
class LaunchPreset:
    """Launch defaults a builtin shortcut brings when no runtime is chosen."""

    model: str | None = None
    reasoning_effort: str | None = None


@dataclass(frozen=True)
class Profile:
    """A named launch identity: an engine plus defaults."""

    name: str
    engine: str
    kind: str = "builtin"
    description: str = ""
    preset: LaunchPreset = field(default_factory=LaunchPreset)

    def digest(self) -> str:
        """Return a content digest frozen into snapshots."""
        body = json.dumps(asdict(self), sort_keys=True).encode()
        return "sha256:" + hashlib.sha256(body).hexdigest()[:32]

    def public(self) -> dict:
        """Return the listing shape."""
        return {"name": self.name, "engine": self.engine, "kind": self.kind, "description": self.description,
                "preset": asdict(self.preset), "digest": self.digest()}


BUILTINS: dict[str, Profile] = {
    p.name: p
    for p in (
        Profile("claude", "claude", description="Claude Code CLI"),
        Profile("codex", "codex", description="OpenAI Codex CLI"),
        Profile("pi", "pi", description="Pi coding agent"),
        Profile("scripted", "scripted", description="Deterministic scripted engine for tests and demos; the prompt is the script"),
    )
}


def resolve_profile(name: str | None, default: str) -> Profile:
    """Return the named profile (or the default), refusing unknown names with the list to choose from."""
    key = (name or default).strip()
    profile = BUILTINS.get(key)
    if profile is None:
        raise Invalid(f"unknown profile {key!r}; choose one of {', '.join(sorted(BUILTINS))} (see profile_list)")
    return profile
