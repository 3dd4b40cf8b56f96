"""What a task child inherits from the runner: an allowlist, never the runner's whole environment.

A child gets the variables below from the runner's environment, then what its engine adapter needs to
find its own configuration (`CliEngine.config_env`), then the launch's own variables (HOME set to the
run's directory, the policy's native variables, the profile's credentials, AMUX_HUB_URL / AMUX_TOKEN /
AMUX_SESSION_ID). Everything else of the runner's — its token, AMUX_SECRET_KEY, database URLs,
AMUX_HOME, cloud keys — stays out.
"""
from __future__ import annotations

import os
from typing import Mapping

ALLOWED = frozenset({"PATH", "HOME", "LANG", "LANGUAGE", "TERM", "TZ", "USER"})
ALLOWED_PREFIXES = ("LC_",)


def allowed(name: str) -> bool:
    """Return whether a runner variable may pass to a task child."""
    return name in ALLOWED or name.startswith(ALLOWED_PREFIXES)


def base_env(source: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the allowlisted part of `source` (default: this process's environment); PATH always set."""
    src = os.environ if source is None else source
    env = {k: v for k, v in src.items() if allowed(k)}
    env.setdefault("PATH", os.defpath)
    return env


def child_env(extra: Mapping[str, str], source: Mapping[str, str] | None = None) -> dict[str, str]:
    """Return the complete environment of a child: the allowlist, overridden by the launch's `extra`."""
    return {**base_env(source), **extra}
