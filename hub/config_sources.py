"""Where settings come from: pydantic-settings sources for the TOML file, the `AMUX_*` environment and the CLI's
flags (highest first: flags, environment, file, defaults), a strict check of every key they name, and the
effective configuration with its sources and secrets masked (`amux config show`)."""
from __future__ import annotations

import difflib
import os
import re
import tomllib
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

from pydantic import BaseModel, ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource, TomlConfigSettingsSource
from pydantic_settings.exceptions import SettingsError
from pydantic_settings.sources.utils import parse_env_vars

from .config import SOURCES, Settings
from .errors import Invalid

# `AMUX_*` variables that are not settings: the CLI's and a task child's (hub/engines), engine binaries, the
# deploy files' (compose, install.sh), the test, bench, soak and fuzz knobs. They never stop a start.
NOT_SETTINGS = frozenset({
    "AMUX_TOKEN", "AMUX_HUB_URL", "AMUX_SESSION_ID", "AMUX_BOX_ID", "AMUX_EXEC_ID", "AMUX_LOG_LEVEL",
    "AMUX_CLAUDE_BIN", "AMUX_CODEX_BIN", "AMUX_PI_BIN", "AMUX_SCRIPTED_BIN",
    "AMUX_TEST_DATABASE_URL", "AMUX_PROPERTY_EXAMPLES", "AMUX_ESCAPE_CANARY", "AMUX_PG_DIR", "AMUX_PG_THROWAWAY",
    "AMUX_IMAGE", "AMUX_HTTP_PORT", "AMUX_RUNNER_TOKEN", "AMUX_USER", "AMUX_UID",
})
NOT_SETTINGS_PREFIXES = ("AMUX_SOAK_", "AMUX_BENCH_", "AMUX_FUZZ_", "AMUX_TEST_")
ALIASES = {"AMUX_LOG_LEVEL": "AMUX_LOG__LEVEL"}  # older spellings still read (README "Configuration")
SECRETS = frozenset({"app_secret", "encrypt_key", "verification_token", "secret_key", "metrics_token"})

Path_ = tuple[str, ...]


class MappingEnvSource(EnvSettingsSource):
    """The library's environment source over a given mapping (tests pass one; the CLI passes `os.environ`)."""

    def __init__(self, settings_cls: type[BaseSettings], env: Mapping[str, str]) -> None:
        self._mapping = env
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._mapping, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


@dataclass
class Loaded:
    """Settings and where each leaf came from ("file PATH", "env NAME", "flag"; absent: the default)."""

    settings: Settings
    config_path: Path
    sources: dict[Path_, str] = field(default_factory=dict)

    def source_of(self, path: Path_) -> str:
        """Return where the value at `path` (or the table holding it) came from."""
        for n in range(len(path), 0, -1):
            if path[:n] in self.sources:
                return self.sources[path[:n]]
        return "default"


def load_settings(config_file: Any = None, env: Any = None, **overrides: Any) -> Settings:
    """Read the TOML file (if any), overlay `AMUX_*` variables, then explicit overrides; refuse unknown keys."""
    return load(config_file, env, overrides).settings


def load(config_file: str | os.PathLike[str] | None, env: Mapping[str, str] | None,
         overrides: Mapping[str, Any]) -> Loaded:
    """Load settings from the TOML file, the environment and `overrides`, refusing any key no setting has."""
    env = os.environ if env is None else env
    overrides = {k: v for k, v in overrides.items() if v is not None}
    home = Path(overrides.get("home") or env.get("AMUX_HOME") or ".amux")
    path = Path(config_file) if config_file else home / "amux.toml"
    data: dict[str, Any] = {}
    if path.exists():
        try:
            data = tomllib.loads(path.read_text())
        except tomllib.TOMLDecodeError as e:
            raise Invalid(f"config file {path} is not valid TOML ({e}); fix the line it names") from e
    elif config_file:
        raise Invalid(f"config file {path} does not exist; pass an existing file to --config")
    for dotted in unknown_keys(Settings, data):
        near = _nearest(re.sub(r"\[\d+\]", "[]", dotted), toml_keys())
        raise Invalid(f"config file {path}: unknown key {dotted}{near}; fix or remove it")
    given = env
    env = {ALIASES.get(k, k): v for k, v in env.items() if not (k in ALIASES and ALIASES[k] in env)}
    names = [k for k in env if k.upper().startswith("AMUX_") and not _not_a_setting(k.upper())]
    for name in sorted(names):
        if not env_key_known(name):
            raise Invalid(f"unknown setting {name}{_nearest(name.upper(), env_keys())}; fix or unset it (see "
                          "README \"Configuration\"; `amux config show` lists every key)")
    sources = (MappingEnvSource(Settings, env), TomlConfigSettingsSource(Settings, toml_file=path if data else None))
    token = SOURCES.set(sources)
    try:
        settings = Settings(**overrides)
    except SettingsError as e:  # a list or table given as a variable that is not JSON
        top = re.search(r'field "([^"]+)"', str(e))
        named = [n for n in names if top and _env_path(n)[0] == top.group(1)] or ["an AMUX_* variable"]
        raise Invalid(f"bad configuration: {' or '.join(named)} is not valid JSON ({e.__cause__ or e}); a list "
                      "or table set from the environment is JSON, e.g. AMUX_FEISHU__APPS='[{\"app_id\": \"cli_…\"}]'"
                      ) from e
    except ValidationError as e:
        err = e.errors()[0]
        loc = tuple(str(p) for p in err["loc"])
        where = next((f"the variable {n}" for n in names if loc[:len(_env_path(n))] == _env_path(n)), None)
        where = where or (f"{path}" if data else f"{path} or the variable AMUX_{'__'.join(loc).upper()}")
        raise Invalid(f"bad configuration: {'.'.join(loc)}: {err['msg']}; fix it in {where}") from e
    finally:
        SOURCES.reset(token)
    loaded = Loaded(settings, path)
    for leaf in _leaves(data):
        loaded.sources[leaf] = f"file {path}"
    for name in names:
        loaded.sources[_env_path(name)] = "env " + next(
            (old for old, new in ALIASES.items() if new == name and old in given), name)
    for key in overrides:
        loaded.sources[(key,)] = "flag"
    if settings.feishu.apps_file is not None:
        loaded.sources[("feishu", "apps")] = f"file {settings.feishu.apps_file} (feishu.apps_file)"
    return loaded


def _env_path(name: str) -> Path_:
    return tuple(name[5:].lower().split("__"))


def _not_a_setting(name: str) -> bool:
    return name in NOT_SETTINGS or name.startswith(NOT_SETTINGS_PREFIXES)


def _nearest(key: str, valid: list[str]) -> str:
    match = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    return f"; did you mean {match[0]}?" if match else ""


# ---------------------------------------------------------------- the key tree

def _model_in(annotation: Any) -> tuple[str, type[BaseModel]] | None:
    """Say how a field holds a model: ("model", M), ("dict", M) for dict[str, M], ("list", M) for list[M]."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _model_in(typing.get_args(annotation)[0])
    if origin in (typing.Union, types.UnionType):
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found:
                return found
        return None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return ("model", annotation)
    args = typing.get_args(annotation)
    if origin is dict and len(args) == 2:
        inner = _model_in(args[1])
        return ("dict", inner[1]) if inner and inner[0] == "model" else None
    if origin is list and args:
        inner = _model_in(args[0])
        return ("list", inner[1]) if inner and inner[0] == "model" else None
    return None


def unknown_keys(model: type[BaseModel], data: Mapping[str, Any], prefix: str = "") -> Iterator[str]:
    """Yield the dotted keys of `data` (a TOML tree) that no field of `model` has."""
    for key, value in data.items():
        f = model.model_fields.get(key)
        if f is None:
            yield prefix + key
            continue
        held = _model_in(f.annotation)
        if held is None:
            continue
        kind, inner = held
        if kind == "model" and isinstance(value, Mapping):
            yield from unknown_keys(inner, value, f"{prefix}{key}.")
        elif kind == "dict" and isinstance(value, Mapping):
            for k, v in value.items():
                if isinstance(v, Mapping):
                    yield from unknown_keys(inner, v, f"{prefix}{key}.{k}.")
        elif kind == "list" and isinstance(value, list):
            for i, v in enumerate(value):
                if isinstance(v, Mapping):
                    yield from unknown_keys(inner, v, f"{prefix}{key}[{i}].")


def env_key_known(name: str) -> bool:
    """Say whether an `AMUX_*` variable names a setting (a leaf, or a table given as JSON)."""
    parts = name[5:].lower().split("__")
    model: type[BaseModel] = Settings
    while parts:
        f = model.model_fields.get(parts.pop(0))
        if f is None:
            return False
        held = _model_in(f.annotation)
        if not parts:
            return True
        if held is None or held[0] == "list":
            return False
        if held[0] == "dict":
            parts.pop(0)  # the table's own key (a preset name)
            if not parts:
                return True
        model = held[1]
    return True


def _paths(model: type[BaseModel], prefix: Path_ = ()) -> Iterator[Path_]:
    for key, f in model.model_fields.items():
        held = _model_in(f.annotation)
        if held and held[0] == "model":
            yield from _paths(held[1], prefix + (key,))
        elif held and held[0] == "dict":
            yield from _paths(held[1], prefix + (key, "<name>"))
        elif held and held[0] == "list":
            yield prefix + (key,)
            yield from _paths(held[1], prefix + (key + "[]",))
        else:
            yield prefix + (key,)


def toml_keys() -> list[str]:
    """Every dotted key the TOML file may set."""
    return [".".join(p) for p in _paths(Settings)]


def env_keys() -> list[str]:
    """Every `AMUX_*` variable that sets a leaf."""
    return ["AMUX_" + "__".join(p).upper() for p in _paths(Settings) if not any(k.endswith("[]") for k in p)]


def _leaves(data: Mapping[str, Any], prefix: Path_ = ()) -> Iterator[Path_]:
    for key, value in data.items():
        if isinstance(value, Mapping):
            yield from _leaves(value, prefix + (key,))
        else:
            yield prefix + (key,)


# ---------------------------------------------------------------- `amux config show`

def mask(key: str, value: Any) -> Any:
    """Hide a secret's value (its presence stays visible); a database URL keeps all but its password."""
    if value in (None, ""):
        return value
    if key in SECRETS:
        return "***"
    if key == "database_url" and isinstance(value, str):
        from sqlalchemy.engine import make_url
        try:
            return make_url(value).render_as_string(hide_password=True)
        except Exception:  # noqa: BLE001 - not a URL SQLAlchemy reads: show nothing of it
            return "***"
    return value


def effective(loaded: Loaded) -> list[tuple[str, Any, str]]:
    """Every leaf of the effective settings as (dotted key, masked value, source)."""
    rows: list[tuple[str, Any, str]] = []

    def walk(value: Any, path: Path_) -> None:
        if isinstance(value, dict) and value:
            for k, v in value.items():
                walk(v, path + (k,))
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for i, v in enumerate(value):
                for k, item in v.items():
                    rows.append((f"{'.'.join(path)}[{i}].{k}", mask(k, item), loaded.source_of(path)))
        else:
            rows.append((".".join(path), mask(path[-1], value), loaded.source_of(path)))

    walk(loaded.settings.model_dump(mode="json"), ())
    return rows
