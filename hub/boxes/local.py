"""The driver the hub runs boxes on this machine with: bubblewrap sandboxes (`boxes.driver = "local"`) or, by the
operator's explicit choice, unsandboxed processes (`boxes.driver = "unsandboxed"`).

Two drivers do the work (hub/boxes/bubblewrap.py, hub/boxes/unsandboxed.py). This one makes new boxes with the
configured driver and serves every stored box with the driver its handle names (`"sandbox": "bwrap"` or `"none"`),
so boxes made before the operator changed `boxes.driver` keep working and are destroyed the same way.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from ..config import BoxSettings
from .base import OUTPUT_CAP_BYTES, BoxError, BoxInfo, ExecResult
from .bubblewrap import NO_BWRAP, BubblewrapBoxDriver
from .host import NO_SANDBOX_RECORD
from .unsandboxed import UnsandboxedBoxDriver
from .uids import UidClaims

__all__ = ["NO_BWRAP", "NO_SANDBOX_RECORD", "BubblewrapBoxDriver", "LocalBoxDriver", "UnsandboxedBoxDriver"]


class LocalBoxDriver:
    """Make boxes with the configured local driver; serve each stored box with the driver that made it.

    A handle that names neither sandbox (a box caught half-made, or a record without its sandbox) runs nothing,
    reads as not alive, and is destroyed with the bubblewrap driver's cleanup, which removes whatever either made.
    """

    def __init__(self, root: Path, settings: BoxSettings | None = None, *, hide: list[Path] | None = None,
                 output_cap: int = OUTPUT_CAP_BYTES, uids: UidClaims | None = None) -> None:
        self.settings = settings or BoxSettings()
        uids = uids or UidClaims()
        self.bubblewrap = BubblewrapBoxDriver(root, self.settings, hide=hide, output_cap=output_cap, uids=uids)
        self.unsandboxed = UnsandboxedBoxDriver(root, self.settings, hide=hide, output_cap=output_cap, uids=uids)
        self.maker: BubblewrapBoxDriver | UnsandboxedBoxDriver = (
            self.bubblewrap if self.settings.driver == "local" else self.unsandboxed)
        self.name = self.maker.name
        self.sandboxed = self.maker.sandboxed
        self.host = self.maker.host  # the machine its boxes live on

    def _serving(self, handle: dict[str, Any]) -> BubblewrapBoxDriver | UnsandboxedBoxDriver | None:
        """Return the driver a stored handle names, or None when it names no sandbox."""
        sandbox = handle.get("sandbox")
        return self.bubblewrap if sandbox == "bwrap" else self.unsandboxed if sandbox == "none" else None

    def provisional(self, box_id: str) -> dict[str, Any]:
        """Return the handle of a box being made: enough for `destroy` to find whatever `create` left."""
        return self.maker.provisional(box_id)

    async def create(self, box_id: str) -> dict[str, Any]:
        """Make the box with the configured driver and return its handle."""
        return await self.maker.create(box_id)

    async def exec(self, handle: dict[str, Any], command: str, timeout_s: float) -> ExecResult:
        """Run a command in the box with the driver that made it; refuse a handle without its sandbox record."""
        driver = self._serving(handle)
        if driver is None:
            box_id, _ = self.maker.here(handle)
            raise BoxError(NO_SANDBOX_RECORD.format(box_id=box_id))
        return await driver.exec(handle, command, timeout_s)

    async def destroy(self, handle: dict[str, Any]) -> None:
        """Destroy the box with the driver that made it (a handle naming neither: the bubblewrap cleanup)."""
        await (self._serving(handle) or self.bubblewrap).destroy(handle)

    async def describe(self, handle: dict[str, Any]) -> BoxInfo:
        """Describe the box with the driver that made it (a handle naming neither reads as not alive)."""
        return await (self._serving(handle) or self.unsandboxed).describe(handle)

    async def alive(self, handle: dict[str, Any]) -> bool | None:
        """Say whether the box still runs; None when it lives on another machine."""
        return await (self._serving(handle) or self.unsandboxed).alive(handle)
