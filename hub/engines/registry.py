"""The engines this build knows: adding an engine is one adapter module and one row here."""
from __future__ import annotations

from .base import Engine
from .claude import ClaudeEngine
from .codex import CodexEngine
from .pi import PiEngine
from .scripted import ScriptedEngine

ENGINES: dict[str, type] = {
    "claude": ClaudeEngine,
    "codex": CodexEngine,
    "pi": PiEngine,
    "scripted": ScriptedEngine,
}


def default_engines() -> dict[str, Engine]:
    """Return one instance of every known engine; the runner keeps those available on its machine."""
    return {name: cls() for name, cls in ENGINES.items()}
