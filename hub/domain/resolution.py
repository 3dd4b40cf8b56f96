"""Execution-choice resolution (seed: "Task execution choices belong to amux, not v2 Profile content").

A pure function of (profile, request, session context, presets): which runtime, model and reasoning
effort a launch uses. The order of the rules is the seed's order; each is a test in
tests/unit/test_resolution.py.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..errors import Invalid


@dataclass(frozen=True)
class Preset:
    """A builtin launch preset: where and with what model a shortcut launches by default."""

    runtime: str | None = None
    model: str | None = None
    reasoning_effort: str | None = None


@dataclass(frozen=True)
class ProfileView:
    """What resolution needs of a profile."""

    name: str
    engine: str
    builtin: bool
    allow_model_override: bool = True


@dataclass(frozen=True)
class SessionContext:
    """The calling Session's current choices (for Tasks submitted from a Session)."""

    engine: str
    model: str | None
    reasoning_effort: str | None


@dataclass(frozen=True)
class Choices:
    """What the caller asked for; None means omitted."""

    runtime: str | None = None
    model: str | None = None
    reasoning_effort: str | None = None


@dataclass(frozen=True)
class Resolved:
    """The resolved choices frozen into the snapshot, with where each came from."""

    runtime: str | None
    model: str | None
    reasoning_effort: str | None
    preset: str | None
    sources: dict


EFFORTS = ("minimal", "low", "medium", "high", "xhigh")


def resolve(profile: ProfileView, asked: Choices, presets: dict[str, Preset], default_preset: str,
            session: SessionContext | None = None) -> Resolved:
    """Resolve runtime, model and effort.

    1. An explicit runtime and model win.
    2. From a Session on the same engine, the Session's current model and effort are inherited; when the
       child's profile can't take them (its policy forbids a model override), the caller's own resolution
       below is kept instead.
    3. Without a runtime, a builtin shortcut uses its own launch preset, and without one of its own its
       engine's native defaults (no runtime pin, no model, no effort: never another engine's preset);
       other profiles use the distribution's default builtin launch preset.
    4. An omitted model uses that preset's model when its runtime is inherited, or the engine's native
       default (None) when no model is configured. A preset's model and effort stay in its engine (a
       builtin preset is named for its engine): a profile on another engine inherits only its runtime.
    5. Model names are not an allowlist: unlisted names pass unchanged.
    """
    if asked.reasoning_effort is not None and asked.reasoning_effort not in EFFORTS:
        raise Invalid(f"reasoning_effort {asked.reasoning_effort!r} is not one of {', '.join(EFFORTS)}")
    if asked.model is not None and not profile.allow_model_override:
        raise Invalid(f"profile {profile.name!r} does not allow a model override; omit model or use another profile")
    sources: dict[str, str] = {}
    model, effort = asked.model, asked.reasoning_effort
    if model is not None:
        sources["model"] = "explicit"
    if effort is not None:
        sources["reasoning_effort"] = "explicit"
    if session is not None and session.engine == profile.engine and profile.allow_model_override:
        if model is None and session.model is not None:
            model, sources["model"] = session.model, "session"
        if effort is None and session.reasoning_effort is not None:
            effort, sources["reasoning_effort"] = session.reasoning_effort, "session"
    preset_name = None
    runtime = asked.runtime
    if runtime is not None:
        sources["runtime"] = "explicit"
    elif profile.builtin and profile.name not in presets:
        sources["runtime"] = "engine-default"  # any runtime that offers the engine
    else:
        preset_name = profile.name if profile.builtin else default_preset
        preset = presets.get(preset_name, Preset())
        runtime = preset.runtime
        sources["runtime"] = f"preset:{preset_name}"
        same_engine = preset_name == profile.engine
        if model is None and preset.model is not None and profile.allow_model_override and same_engine:
            model, sources["model"] = preset.model, f"preset:{preset_name}"
        if effort is None and preset.reasoning_effort is not None and same_engine:
            effort, sources["reasoning_effort"] = preset.reasoning_effort, f"preset:{preset_name}"
    sources.setdefault("model", "engine-default")
    sources.setdefault("reasoning_effort", "engine-default")
    return Resolved(runtime, model, effort, preset_name, sources)
