"""The engine interface every adapter implements."""
from __future__ import annotations

import asyncio
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Mapping, Protocol, Sequence

Emit = Callable[[str, dict[str, Any]], Awaitable[None]]
# Deliver a correction into the running turn: None once the engine's protocol took it, else why it could not.
SteerInto = Callable[[str], Awaitable[str | None]]
NO_STEERING = ("{engine} takes no input during a turn; the correction waits for the next prompt")


class Sandbox(Protocol):
    """Where a run's child is launched when the run has a boundary (hub.runner.boundary.Boundary: linux-dac,
    userns); the runner makes it, the engines only launch inside it."""

    def wrap(self, command: Sequence[str], env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
        """Return (argv, env) that run `command` inside the sandbox."""
        ...


@dataclass
class Job:
    """One attempt of a task as the runner launches it."""

    task_id: str
    attempt: int
    prompt: str
    snapshot: dict[str, Any]
    workspace: Path
    env: dict[str, str] = field(default_factory=dict)
    # Decisions for `permission` events (escalate-to-main): PermissionReply items, in any order.
    permission_replies: asyncio.Queue = field(default_factory=asyncio.Queue)
    # Where a correction for the running turn goes (instance_steer): set by the engine while its protocol can take
    # input mid-turn, None before and after (and always, for an engine that cannot). See `Engine.steering_refusal`.
    steer_into: SteerInto | None = None
    # The sandbox the child runs inside (linux-dac, userns); None: the runner's own uid.
    boundary: Sandbox | None = None
    # The run's resource limits (hub.runner.confine.Confinement), entered by the child before it execs; None: none.
    confine: Any = None


@dataclass(frozen=True)
class PermissionReply:
    """The caller's answer to one permission request of a running task."""

    request_id: str
    allow: bool
    message: str = ""


@dataclass
class EngineResult:
    """What an engine reports when it ends on its own (cancel and timeout are the runner's)."""

    outcome: str  # succeeded | failed
    text: str = ""
    json: Any = None
    error: str | None = None
    resume_handle: str | None = None


class Engine(Protocol):
    """Launch one job and stream canonical events through `emit`.

    Rules: emit `text`, `tool`, `usage`, `question` events in order; a `tool` event carries the tool's raw
    `input`, `output`, `diff` and `locations` where the provider reports them (they reach only the Agent Timeline;
    task events keep id, name, title and status); return an EngineResult when the engine ends; on cancellation
    (asyncio.CancelledError) stop the child and its processes before re-raising. Steering: while the provider's
    protocol takes input mid-turn, set `job.steer_into`; `steering_refusal(snapshot)` says why a run cannot (None:
    it can, once the turn runs).
    """

    name: str

    def available(self) -> bool:
        """Return whether this machine can launch the engine."""

    async def run(self, job: Job, emit: Emit) -> EngineResult:
        """Run the job to its end."""


class CliEngine:
    """An engine launched as a CLI found on PATH; `AMUX_<NAME>_BIN` names another executable (tests point at fakes)."""

    name = ""
    # (variable, default folder under the runner's home): how the CLI finds its own config and login
    # when HOME is the run's folder. Passed through when the runner sets it, else pointed at the default.
    config_dirs: tuple[tuple[str, str], ...] = ()

    def config_env(self, source: dict[str, str] | None = None) -> dict[str, str]:
        """Return the variables that let the CLI find its own configuration from a per-run HOME."""
        src = os.environ if source is None else source
        out: dict[str, str] = {}
        for var, default in self.config_dirs:
            if src.get(var):
                out[var] = src[var]
            elif src.get("HOME") and os.path.isdir(os.path.join(src["HOME"], default)):
                out[var] = os.path.join(src["HOME"], default)
        return out

    def binary(self) -> str:
        """Return the executable to launch."""
        return os.environ.get(f"AMUX_{self.name.upper()}_BIN") or self.name

    def available(self) -> bool:
        """Return whether the binary is on PATH."""
        return shutil.which(self.binary()) is not None

    def steering_refusal(self, snapshot: dict[str, Any]) -> str | None:
        """Return why a run of this snapshot cannot take a correction mid-turn (None: it can)."""
        return NO_STEERING.format(engine=self.name)
