"""What the local box drivers share: boxes as directories on this machine, commands run with capped output and a
timeout, and the parts of `destroy` that do not depend on the sandbox (hub/boxes/bubblewrap.py, unsandboxed.py)."""
from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from ..clock import within
from ..config import BoxSettings
from .base import OUTPUT_CAP_BYTES, BoxError, ExecResult
from .limits import Limits, existing_cgroups, remove_cgroups
from .uids import UidClaims

BOX_ID = re.compile(r"vm_[0-9a-z]{1,40}")
# After the command exits, background children may still hold its pipes; read what is there, then stop.
_PIPE_GRACE_S = 0.2

NO_SANDBOX_RECORD = ("box {box_id} has no sandbox record (its stored handle names neither a bubblewrap init nor the "
                     "operator's boxes.driver = \"unsandboxed\"), so nothing runs in it; `rift_vm_destroy` it and "
                     "make another with `rift_vm_new`")


class HostBoxes:
    """The machinery of boxes on this machine: each box a directory `root/<box id>`, found again from its handle.

    Subclasses are the drivers (`BubblewrapBoxDriver`, `UnsandboxedBoxDriver`); this class is none by itself.
    """

    def __init__(self, root: Path, settings: BoxSettings | None = None, *, hide: list[Path] | None = None,
                 output_cap: int = OUTPUT_CAP_BYTES, uids: UidClaims | None = None) -> None:
        self.settings = settings or BoxSettings()
        self.root = Path(root).resolve()
        self.hide = [Path(p).resolve() for p in (hide or [])] + [self.root]
        self.output_cap = output_cap
        self.uids = uids or UidClaims()
        self._groups: dict[str, set[int]] = {}
        self.host = socket.gethostname()

    @property
    def limits(self) -> Limits:
        """Return the per-box limits of the settings."""
        return Limits(self.settings.memory_mb << 20, self.settings.pids_max, self.settings.cpus)

    def _dir(self, handle: dict[str, Any]) -> tuple[str, Path]:
        box_id = str(handle.get("box_id", ""))
        if not BOX_ID.fullmatch(box_id):
            raise BoxError("box handle names no box; destroy it with `rift_vm_destroy` and make another with "
                           "`rift_vm_new`")
        return box_id, self.root / box_id

    def _elsewhere(self, handle: dict[str, Any], box_dir: Path) -> str | None:
        """Say where a box lives when it is not here (another replica's machine), else None."""
        host = handle.get("host")
        if box_dir.is_dir() or not host or host == self.host:
            return None
        return (f"box {handle.get('box_id')} lives on host {host}, and this hub replica runs on {self.host}; "
                f"the local driver serves a box only from its own machine")

    def here(self, handle: dict[str, Any]) -> tuple[str, Path]:
        """Return a box's id and directory, or refuse a box that is gone or lives on another machine."""
        box_id, box_dir = self._dir(handle)
        if not box_dir.is_dir():
            raise BoxError(self._elsewhere(handle, box_dir) or f"box {box_id} is gone; make another with `rift_vm_new`")
        return box_id, box_dir

    def provisional(self, box_id: str) -> dict[str, Any]:
        """Return the handle of a box being made: enough for `destroy` to find whatever `create` left."""
        return {"box_id": box_id, "host": self.host, "dir": str(self.root / box_id)}

    def _make_dir(self, box_id: str) -> Path:
        """Make a new box's directory, or refuse a malformed or taken box id."""
        if not BOX_ID.fullmatch(box_id):
            raise BoxError(f"box id {box_id!r} is not vm_<id>")
        box_dir = self.root / box_id
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            box_dir.mkdir(mode=0o700)
        except FileExistsError as e:
            raise BoxError(f"box {box_id} already exists; make another with `rift_vm_new`") from e
        return box_dir

    def _local(self, handle: dict[str, Any]) -> tuple[str, Path]:
        """Return a box's id and directory for `destroy`, or refuse one that lives on another replica's machine."""
        box_id, box_dir = self._dir(handle)
        elsewhere = self._elsewhere(handle, box_dir)
        if elsewhere:  # leave it to the replica on that machine
            raise BoxError(elsewhere)
        return box_id, box_dir

    async def _remove(self, handle: dict[str, Any], box_id: str, box_dir: Path) -> None:
        """Kill whatever carries the box's tag, remove its cgroups and its directory."""
        await self._kill(exec_marker=("AMUX_BOX_ID", box_id), groups=sorted(self._groups.pop(box_id, set())))
        cgroups = handle.get("cgroups") or await asyncio.to_thread(existing_cgroups, box_id)
        if cgroups:
            await asyncio.to_thread(remove_cgroups, cgroups)
        if box_dir.exists():
            await asyncio.to_thread(shutil.rmtree, box_dir, True)

    def _present(self, handle: dict[str, Any]) -> bool | None:
        """Say whether a box's directory is here: None when the box lives on another machine (this replica cannot
        tell whether it runs), False when it is gone."""
        _, box_dir = self._dir(handle)
        if box_dir.is_dir():
            return True
        return None if self._elsewhere(handle, box_dir) else False

    async def _run(self, box_id: str, exec_id: str, argv: list[str], env: dict[str, str], cwd: str,
                   preexec: Any, timeout_s: float, counter: Path | None = None, stdin: int | None = None) -> ExecResult:
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        started = time.monotonic()
        baseline = _count(counter)
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL if stdin is None else stdin, stdout=out_w, stderr=err_w,
                cwd=cwd, env=env, start_new_session=True, preexec_fn=preexec)
        except (OSError, subprocess.SubprocessError) as e:
            os.close(out_r)
            os.close(err_r)
            raise BoxError(f"could not start the command in box {box_id}: {e}") from e
        finally:
            os.close(out_w)
            os.close(err_w)
            if stdin is not None:
                os.close(stdin)
        self._groups.setdefault(box_id, set()).add(proc.pid)
        readers = [asyncio.create_task(self._read_capped(out_r)), asyncio.create_task(self._read_capped(err_r))]
        timed_out = False
        try:
            await within(proc.wait(), timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
            await self._kill(exec_marker=("AMUX_EXEC_ID", exec_id), groups=[proc.pid])
            await proc.wait()
            await _reaped(counter, baseline)
        except asyncio.CancelledError:
            await self._kill(exec_marker=("AMUX_EXEC_ID", exec_id), groups=[proc.pid])
            raise
        finally:
            self._groups.get(box_id, set()).discard(proc.pid)
            _, pending = await asyncio.wait(readers, timeout=_PIPE_GRACE_S)
            for task in pending:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)
        (out, out_cut), (err, err_cut) = (r.result() if not r.cancelled() and r.exception() is None else (b"", False)
                                          for r in readers)
        return ExecResult(
            exit_code=None if timed_out else proc.returncode,
            stdout=out.decode("utf-8", "replace"), stderr=err.decode("utf-8", "replace"),
            stdout_truncated=out_cut, stderr_truncated=err_cut, timed_out=timed_out,
            duration_s=round(time.monotonic() - started, 3))

    async def _read_capped(self, fd: int) -> tuple[bytes, bool]:
        """Read a pipe to its end, keeping the first `output_cap` bytes and draining the rest."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader),
                                                    os.fdopen(fd, "rb", 0))
        kept, truncated = bytearray(), False
        try:
            while chunk := await reader.read(1 << 16):
                room = self.output_cap - len(kept)
                if len(chunk) > room:
                    truncated = True
                kept += chunk[:max(room, 0)]
            return bytes(kept), truncated
        except asyncio.CancelledError:
            # Cancelled after the grace: what was read so far is the answer.
            return bytes(kept), truncated
        finally:
            transport.close()

    async def _kill(self, exec_marker: tuple[str, str], groups: list[int]) -> None:
        for pgid in groups:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pgid, signal.SIGKILL)
        # Processes that left their group (setsid, double fork) still carry the tag; repeat until none are left.
        for _ in range(50):
            pids = await asyncio.to_thread(_tagged_pids, *exec_marker)
            if not pids:
                return
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            await asyncio.sleep(0.01)



def _count(counter: Path | None) -> int | None:
    """Return the processes the box's pids cgroup counts now (zombies included), or None without one."""
    if counter is None:
        return None
    try:
        return int(counter.read_text())
    except (OSError, ValueError):
        return None


async def _reaped(counter: Path | None, baseline: int | None, within_s: float = 2.0) -> None:
    """Wait, at most `within_s`, until the box counts no more processes than before the command it killed: a killed
    process holds its place in the box's process limit until the box's init reaps it, and a fork bomb's remains
    would refuse the box's next command (`fork: Resource temporarily unavailable`)."""
    if baseline is None:
        return
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        now = _count(counter)
        if now is None or now <= baseline:
            return
        await asyncio.sleep(0.01)



def _tagged_pids(key: str, value: str) -> list[int]:
    """Return live processes whose environment holds `key=value`."""
    needle = f"{key}={value}".encode()
    found = []
    me = os.getpid()
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            with open(f"/proc/{entry.name}/environ", "rb") as f:
                env = f.read()
        except OSError:
            continue
        if needle in env.split(b"\0"):
            found.append(int(entry.name))
    return found


def _start_time(pid: int | None) -> int | None:
    """Return a process's start time (clock ticks since boot): with the pid, it names one process for good."""
    if not isinstance(pid, int) or pid <= 0:
        return None
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()
    return None if fields[0] in ("Z", "X") else int(fields[19])

