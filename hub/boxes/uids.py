"""Host uids for boxes: each live box on a machine holds a uid no other live box there holds.

A uid is a resource of the host, not of one hub: every hub on the machine (replicas of one database, or hubs with
databases of their own) draws from the same range, and hubs on other machines do not collide with it. So the claim
lives on the host, not in the database: one file per uid, made with `O_CREAT | O_EXCL` (atomic on any local
filesystem, so two hubs claiming at once never both win) under a directory every hub of the machine shares, by
default on `/run` — which a reboot empties, as it ends every box.
"""
from __future__ import annotations

import contextlib
import os
from pathlib import Path

from .base import BoxError

UID_BASE, UID_SPAN = 200_000, 60_000
UID_DIR = Path("/run/amux/box-uids")


class UidClaims:
    """Claim and release the host uids of boxes: `<directory>/<uid>` holds the id of the box that has it."""

    def __init__(self, directory: Path = UID_DIR, base: int = UID_BASE, span: int = UID_SPAN) -> None:
        self.directory = Path(directory)
        self.base, self.span = base, span

    def claim(self, box_id: str) -> int:
        """Return the lowest uid of the range no live box holds, now held by `box_id`; refuse when none is free.

        A uid some process of the machine runs as is not free either, claimed or not (a box made before claims
        existed, or a user of the machine).
        """
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        taken = {int(n) for n in os.listdir(self.directory) if n.isdigit()}
        taken |= _running_uids(self.base, self.base + self.span)
        for uid in range(self.base, self.base + self.span):
            if uid in taken:
                continue
            try:
                fd = os.open(self.directory / str(uid), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:  # another hub claimed it since the listing
                continue
            with os.fdopen(fd, "w") as f:
                f.write(box_id)
            return uid
        raise BoxError(f"all {self.span} box uids of this machine ({self.base}–{self.base + self.span - 1}) are held "
                       f"by live boxes; `rift_vm_destroy` boxes you no longer need (or `rift_task_close` their task) "
                       f"and try `rift_vm_new` again")

    def release(self, box_id: str, uid: int | None = None) -> None:
        """Give back the uid `box_id` holds (found by scanning when `uid` is None); never another box's claim."""
        names = [str(uid)] if isinstance(uid, int) else [n for n in self._names() if n.isdigit()]
        for name in names:
            path = self.directory / name
            with contextlib.suppress(OSError):  # gone already, or a hub that is not root has no claims to give
                if path.read_text() == box_id:
                    path.unlink()

    def held(self) -> dict[int, str]:
        """Return every claimed uid and the box holding it."""
        found = {}
        for name in self._names():
            with contextlib.suppress(FileNotFoundError, ValueError):
                found[int(name)] = (self.directory / name).read_text()
        return found

    def _names(self) -> list[str]:
        try:
            return os.listdir(self.directory)
        except OSError:
            return []


def _running_uids(low: int, high: int) -> set[int]:
    """Return the uids in [low, high) that live processes of the machine run as (the owner of `/proc/<pid>` is its
    effective uid; a zombie holds nothing but its pid, and where no reaper waits for it, it never goes)."""
    found = set()
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError, IndexError):
                uid = entry.stat(follow_symlinks=False).st_uid
                if low <= uid < high and uid not in found:
                    state = Path(entry.path, "stat").read_text().rsplit(")", 1)[1].split()[0]
                    if state not in ("Z", "X"):
                        found.add(uid)
    return found
