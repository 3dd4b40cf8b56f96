"""How the `amux` CLI finds its home and its hub (DESIGN §7 "CLI discovery").

A hub started by `amux up` / `amux hub serve` writes `$AMUX_HOME/hub.json` (`{"url", "pid"}`) once it listens
(with the real port when `--listen HOST:0` asked for a free one) and removes it when it stops. A client command
uses `--hub`, else `AMUX_HUB_URL`, else that file, else `http://127.0.0.1:8787`, and says which one it tried when
it cannot connect. A missing or unreadable home is one line naming the fix, never a traceback.
"""
from __future__ import annotations

import argparse
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import AmuxError

if TYPE_CHECKING:
    from ..config import Settings

DEFAULT_HUB = "http://127.0.0.1:8787"
HUB_FILE = "hub.json"


class HomeError(AmuxError):
    """The amux home is missing or unreadable; the message names the fix."""

    status = 400
    code = "bad_home"


def home_dir() -> Path:
    """Return `$AMUX_HOME`, defaulting to `./.amux`."""
    return Path(os.environ.get("AMUX_HOME") or ".amux")


def _where(home: Path) -> str:
    return f"AMUX_HOME={home}" if os.environ.get("AMUX_HOME") else f"the default home {home} (AMUX_HOME is not set)"


def check_home(home: Path, *, create: bool) -> Path:
    """Return `home` as a usable directory (made when `create`); raise HomeError naming the fix otherwise."""
    if home.exists() and not home.is_dir():
        raise HomeError(f"{_where(home)} is not a directory; set AMUX_HOME to a directory (or remove that file)")
    if not home.exists():
        if not create:
            raise HomeError(f"{_where(home)} does not exist; start a hub there with `amux up` (it creates the home), "
                            "set AMUX_HOME to an existing home, or pass --db URL")
        try:
            home.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise HomeError(f"cannot create {_where(home)} ({e.strerror}); set AMUX_HOME to a writable "
                            "directory") from e
    if not os.access(home, os.R_OK | os.X_OK) or (create and not os.access(home, os.W_OK)):
        raise HomeError(f"{_where(home)} is not readable{' and writable' if create else ''} by this user; "
                        "fix its permissions or set AMUX_HOME to your own home")
    return home


def home_settings(args: argparse.Namespace, *, create_home: bool = False) -> Settings:
    """Load settings; the home must exist (or is created by `create_home`) unless --db names another database."""
    from ..config_sources import load_settings

    settings = load_settings(getattr(args, "config", None), database_url=getattr(args, "db", None),
                             listen=getattr(args, "listen", None))
    if create_home or not settings.database_url or settings.home.exists():
        check_home(settings.home, create=create_home)
    return settings


def read_text(path: Path, what: str) -> str | None:
    """Return a home file's stripped text, None when absent; raise HomeError when it exists but cannot be read."""
    if not path.exists():
        return None
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError) as e:
        reason = e.strerror if isinstance(e, OSError) else "not text"
        raise HomeError(f"cannot read {what} {path} ({reason}); fix its permissions, or remove it and restart "
                        "`amux up` to write it again") from e


def write_hub_file(home: Path, url: str, pid: int | None = None) -> Path:
    """Write `home/hub.json` atomically; return its path."""
    path = home / HUB_FILE
    tmp = path.with_name(f".{HUB_FILE}.{os.getpid()}")
    tmp.write_text(json.dumps({"url": url, "pid": pid or os.getpid()}) + "\n")
    os.replace(tmp, path)
    return path


def remove_hub_file(home: Path, pid: int | None = None) -> None:
    """Remove `home/hub.json` if this process (`pid`) wrote it (a newer hub's file is left alone)."""
    path = home / HUB_FILE
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if data.get("pid") == (pid or os.getpid()):
        path.unlink(missing_ok=True)


@dataclass(frozen=True)
class HubAddress:
    """The hub URL a client command uses and where it came from (said when the hub cannot be reached)."""

    url: str
    source: str


def resolve_hub(flag: str | None, home: Path | None = None) -> HubAddress:
    """Return `--hub`, else `AMUX_HUB_URL`, else `$AMUX_HOME/hub.json`, else the default."""
    if flag:
        return HubAddress(flag.rstrip("/"), "--hub")
    env = os.environ.get("AMUX_HUB_URL")
    if env:
        return HubAddress(env.rstrip("/"), "AMUX_HUB_URL")
    home = home or home_dir()
    path = home / HUB_FILE
    text = read_text(path, "the hub address file") if home.is_dir() else None
    if text is not None:
        try:
            url = json.loads(text)["url"]
            if not isinstance(url, str) or not url.startswith(("http://", "https://")):
                raise ValueError(url)
        except (ValueError, KeyError, TypeError) as e:
            raise HomeError(f"{path} is not a hub address file ({{\"url\": …, \"pid\": …}}); remove it and restart "
                            "`amux up`, or pass --hub URL") from e
        return HubAddress(url.rstrip("/"), str(path))
    return HubAddress(DEFAULT_HUB, f"the default (no --hub, no AMUX_HUB_URL, no {path})")


def resolve_token(flag: str | None, home: Path | None = None) -> str:
    """Return `--token`, else `AMUX_TOKEN`, else `$AMUX_HOME/admin.token`; raise naming the fix when none."""
    token = flag or os.environ.get("AMUX_TOKEN")
    if token:
        return token
    home = home or home_dir()
    if home.exists() and not home.is_dir():
        check_home(home, create=False)
    if not home.exists():
        raise HomeError(f"no token: {_where(home)} does not exist; pass --token, set AMUX_TOKEN, or set AMUX_HOME to "
                        "the home of a running `amux up` (it writes admin.token there)")
    token = read_text(home / "admin.token", "the admin token")
    if not token:
        raise HomeError(f"no token: pass --token, set AMUX_TOKEN, or run `amux up` (it writes {home / 'admin.token'})")
    return token
