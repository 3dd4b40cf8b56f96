"""The `unsandboxed` box driver, by the operator's explicit choice (`boxes.driver = "unsandboxed"`): each box a
directory on this machine and plain processes of the hub's uid, tagged with `AMUX_BOX_ID` (how `destroy` finds them).
Nothing isolates them; the lease service warns at start and every box view says so."""
from __future__ import annotations

import asyncio
from typing import Any

from ..ids import short_id
from . import bwrap as bw
from .base import BoxError, BoxInfo, ExecResult
from .host import NO_SANDBOX_RECORD, HostBoxes, _tagged_pids


class UnsandboxedBoxDriver(HostBoxes):
    """Run each box as a directory and plain processes; only for a handle that says `"sandbox": "none"` (made under
    the operator's `boxes.driver = "unsandboxed"`): a handle that names no sandbox runs nothing."""

    name = "unsandboxed"
    sandboxed = False

    async def create(self, box_id: str) -> dict[str, Any]:
        """Make the box's directory and return its handle."""
        self._make_dir(box_id)
        return {**self.provisional(box_id), "sandbox": "none"}

    async def exec(self, handle: dict[str, Any], command: str, timeout_s: float) -> ExecResult:
        """Run `sh -c command` in the box's directory; kill what it started at the timeout; cap each stream."""
        box_id, box_dir = self.here(handle)
        exec_id = short_id("ex", 10)
        if handle.get("sandbox") != "none":  # fail closed: only the operator's explicit choice runs on the host
            raise BoxError(NO_SANDBOX_RECORD.format(box_id=box_id))
        env = {"PATH": bw.PATH, "HOME": str(box_dir), "LANG": "C.UTF-8", "TERM": "dumb", "AMUX_BOX_ID": box_id,
               "AMUX_EXEC_ID": exec_id}
        return await self._run(box_id, exec_id, ["/bin/sh", "-c", command], env, str(box_dir), None, timeout_s)

    async def destroy(self, handle: dict[str, Any]) -> None:
        """Kill every process tagged with the box's id and remove its directory."""
        box_id, box_dir = self._local(handle)
        await self._remove(handle, box_id, box_dir)

    async def describe(self, handle: dict[str, Any]) -> BoxInfo:
        """Report whether the box's directory is there and how many of its processes run."""
        box_id, box_dir = self._dir(handle)
        alive = box_dir.is_dir() and handle.get("sandbox") == "none"  # a handle without its record runs nothing
        pids = await asyncio.to_thread(_tagged_pids, "AMUX_BOX_ID", box_id)
        return BoxInfo(box_id, handle.get("driver") or self.name, alive,
                       {"dir": str(box_dir), "sandbox": handle.get("sandbox"), "processes": len(pids),
                        "network": handle.get("network"), "limits": handle.get("limits"), "uid": handle.get("uid")})

    async def alive(self, handle: dict[str, Any]) -> bool | None:
        """Say whether the box's directory is there; None when the box lives on another machine."""
        here = self._present(handle)
        return here and handle.get("sandbox") == "none"
