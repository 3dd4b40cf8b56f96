"""The box driver interface every provider (local, VM, cluster) implements."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

DEFAULT_EXEC_TIMEOUT_S = 60.0
MAX_EXEC_TIMEOUT_S = 900.0
OUTPUT_CAP_BYTES = 64 * 1024
MAX_COMMAND_BYTES = 64 * 1024


class BoxError(Exception):
    """A driver refusal; `str()` names the fix."""


@dataclass(frozen=True)
class ExecResult:
    """What one command did: exit code (None when killed at the timeout) and capped output."""

    exit_code: int | None
    stdout: str
    stderr: str
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    timed_out: bool = False
    duration_s: float = 0.0


@dataclass(frozen=True)
class BoxInfo:
    """A driver's description of one box: where it lives and how it is isolated."""

    box_id: str
    driver: str
    alive: bool
    details: dict[str, Any] = field(default_factory=dict)


class BoxDriver(Protocol):
    """Create, use and destroy boxes.

    Rules: `handle` is the JSON-able dict `create` returned; the hub stores it and passes it back, so a
    driver keeps no state it cannot rebuild from it (several hub replicas, restarts). `exec` never leaves a
    command running past its timeout and never returns more than the output cap per stream; a box stays
    usable after a command times out. `destroy` is idempotent: it kills every process of the box and frees
    its resources, and succeeds on a box that is already gone (the reaper may race an explicit destroy).
    """

    name: str
    sandboxed: bool  # False only when the operator chose to run boxes without isolation

    def provisional(self, box_id: str) -> dict[str, Any]:
        """Return the handle of a box not yet made: enough for `destroy` to remove whatever `create` left behind.

        The hub stores it before calling `create`, so a box caught half-made by a crash is still destroyed.
        """

    async def create(self, box_id: str) -> dict[str, Any]:
        """Provision box `box_id` and return its handle.

        Checks that the driver can isolate the box now (not once per process); when it cannot, raises a
        BoxError naming the fix and leaves nothing behind.
        """

    async def exec(self, handle: dict[str, Any], command: str, timeout_s: float) -> ExecResult:
        """Run a shell command in the box and return its exit code and capped output."""

    async def destroy(self, handle: dict[str, Any]) -> None:
        """Kill every process of the box and remove it; a no-op when it is already gone."""

    async def describe(self, handle: dict[str, Any]) -> BoxInfo:
        """Report whether the box is alive and how it is isolated."""

    async def alive(self, handle: dict[str, Any]) -> bool | None:
        """Say whether the box still runs, cheaply enough for every listing (no scan of its processes).

        False when the box can no longer run a command (its init died, e.g. `kill -9 -1` inside it, or the machine
        restarted); None when this replica cannot tell (the box lives on another machine). Never changes the box.
        """
