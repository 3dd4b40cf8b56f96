"""Files at rest: the hub's home is 0700, its secrets and database files 0600, from the moment they exist."""
from __future__ import annotations

import os
from pathlib import Path

DIR_MODE = 0o700
FILE_MODE = 0o600


def private_dir(path: Path) -> Path:
    """Create `path` (and parents) with mode 0700; tighten it if it already exists with wider access."""
    path = Path(path)
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)  # mkdir's mode is filtered by umask: chmod settles it
    if path.stat().st_mode & 0o777 != DIR_MODE:
        path.chmod(DIR_MODE)
    return path


def write_private(path: Path, text: str) -> None:
    """Write `text` to a file that is 0600 before any byte is in it (never readable by others, not even briefly)."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # an existing file keeps its old mode through O_CREAT: reset it
        os.write(fd, text.encode())
    finally:
        os.close(fd)


def private_file(path: Path) -> None:
    """Create `path` empty with mode 0600 if missing, else tighten it to 0600."""
    path = Path(path)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)
    finally:
        os.close(fd)
