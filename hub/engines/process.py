"""A CLI child in its own process group, speaking JSON lines on stdout (and optionally stdin)."""
from __future__ import annotations

import asyncio
import ctypes
import json
import os
import signal
import sys
from collections import deque
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable, Mapping, Sequence

from ..clock import within
from .base import EngineResult, Sandbox
from .environment import child_env

PR_SET_PDEATHSIG = 1
LINE_LIMIT = 32 * 1024 * 1024  # one stream line (a tool result can carry a whole file)
STDERR_TAIL = 2000
EXIT_GRACE_S = 5.0


def die_with_runner() -> None:
    """In the forked child: be killed when the runner dies (PR_SET_PDEATHSIG), so a runner that is killed leaves no
    engine running on without it — nothing of a run it can no longer report on goes on (linux-dac children also
    have bubblewrap's --die-with-parent)."""
    if sys.platform == "linux":
        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def sandboxed(boundary: Sandbox | None, command: Sequence[str],
              env: Mapping[str, str]) -> tuple[list[str], dict[str, str]]:
    """Return (argv, env) that run `command` inside `boundary`; unchanged without one."""
    return (list(command), dict(env)) if boundary is None else boundary.wrap(command, env)


def before_exec(confine: Any = None) -> Callable[[], None]:
    """What the forked child does before it execs anything: die with the runner, and enter the run's limits
    (`hub.runner.confine.Confinement`: its cgroups, or rlimits), so that it never runs unlimited."""
    if confine is None:
        return die_with_runner

    def prepare() -> None:
        die_with_runner()
        confine.enter()
    return prepare


class ChildProcess:
    """One launched CLI: JSON lines out, optional JSON lines in, stderr kept as a short tail."""

    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        self.proc = proc
        self.name = name
        self._stderr: deque[bytes] = deque()
        self._stderr_size = 0
        self._stderr_task = asyncio.ensure_future(self._drain_stderr())

    @classmethod
    async def start(cls, argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], stdin: bool,
                    name: str, boundary: Sandbox | None = None, confine: Any = None) -> "ChildProcess":
        """Launch `argv` in a new session (its own process group) with `env` over the allowlisted environment,
        inside `boundary` when the run has one (linux-dac, userns), within `confine`'s limits when it has them."""
        argv, full_env = sandboxed(boundary, argv, child_env(env))
        proc = await asyncio.create_subprocess_exec(
            *argv, cwd=cwd, env=full_env, start_new_session=True, limit=LINE_LIMIT, preexec_fn=before_exec(confine),
            stdin=asyncio.subprocess.PIPE if stdin else asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )
        return cls(proc, name)

    @property
    def pid(self) -> int:
        """Return the child's pid (also its process group id)."""
        return self.proc.pid

    async def messages(self) -> AsyncIterator[dict[str, Any]]:
        """Yield each stdout line that is a JSON object; other lines are not events and are skipped."""
        assert self.proc.stdout is not None
        while True:
            try:
                line = await self.proc.stdout.readline()
            except ValueError:
                continue  # over LINE_LIMIT: the reader dropped it; what follows is a fresh line
            if not line:
                return
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            if isinstance(msg, dict):
                yield msg

    async def send(self, msg: Mapping[str, Any]) -> str | None:
        """Write one JSON line to stdin; return why it could not be delivered, or None."""
        stdin = self.proc.stdin
        if stdin is None or stdin.is_closing():
            return f"{self.name} stdin is closed"
        if self.proc.returncode is not None:
            return f"{self.name} exited with code {self.proc.returncode}"
        try:
            stdin.write((json.dumps(msg) + "\n").encode())
            await stdin.drain()
        except (BrokenPipeError, ConnectionResetError, OSError) as e:
            return f"{self.name} stdin is closed ({type(e).__name__})"
        return None

    async def send_text(self, text: str) -> str | None:
        """Write raw text to stdin and close it; return why it could not be delivered, or None."""
        stdin = self.proc.stdin
        if stdin is None or stdin.is_closing():
            return f"{self.name} stdin is closed"
        try:
            stdin.write(text.encode())
            await stdin.drain()
        except (BrokenPipeError, ConnectionResetError, OSError) as e:
            return f"{self.name} stdin is closed ({type(e).__name__})"
        finally:
            self.close_stdin()
        return None

    def close_stdin(self) -> None:
        """Signal end of input."""
        if self.proc.stdin is not None and not self.proc.stdin.is_closing():
            self.proc.stdin.close()

    async def wait(self, timeout: float | None = None) -> int | None:
        """Wait for the child to exit; return its code, or None if it is still running after `timeout`."""
        try:
            return await within(self.proc.wait(), timeout)
        except asyncio.TimeoutError:
            return None

    async def stderr_tail(self) -> str:
        """Return the last part of what the child wrote to stderr."""
        try:
            await asyncio.wait_for(asyncio.shield(self._stderr_task), 1.0)
        except (asyncio.TimeoutError, asyncio.CancelledError):
            pass
        return b"".join(self._stderr).decode(errors="replace")[-STDERR_TAIL:].strip()

    def kill(self) -> None:
        """SIGKILL the whole process group (the CLI and everything it started) and stop reading stderr."""
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        self._stderr_task.cancel()

    async def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        while chunk := await self.proc.stderr.read(4096):
            self._stderr.append(chunk)
            self._stderr_size += len(chunk)
            while self._stderr_size - len(self._stderr[0]) >= STDERR_TAIL and len(self._stderr) > 1:
                self._stderr_size -= len(self._stderr.popleft())


async def run_child(argv: Sequence[str], *, cwd: Path, env: Mapping[str, str], stdin: bool, name: str,
                    consume: Callable[[ChildProcess], Awaitable[EngineResult | None]],
                    boundary: Sandbox | None = None, confine: Any = None) -> EngineResult:
    """Launch a CLI, let `consume` read its stream, and always leave its process group dead.

    `consume` returns the EngineResult the stream produced, or None when the stream ended without
    one; that (a crash) becomes a failed result carrying the exit code and the stderr tail.
    Cancellation kills the process group before it propagates.
    """
    try:
        child = await ChildProcess.start(argv, cwd=cwd, env=env, stdin=stdin, name=name, boundary=boundary,
                                         confine=confine)
    except OSError as e:
        return EngineResult("failed", error=f"could not launch {name} ({argv[0]}): {e}")
    try:
        result = await consume(child)
        child.close_stdin()
        if result is None:
            code = await child.wait(EXIT_GRACE_S)
            tail = await child.stderr_tail()
            return EngineResult("failed", error=f"{name} exited with code {code} without a result"
                                + (f": {tail}" if tail else ""))
        await child.wait(EXIT_GRACE_S)
        return result
    finally:
        # Normal end, a question, a crash or cancellation: nothing the CLI started outlives the run.
        child.kill()
