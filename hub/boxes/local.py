"""The `local` box driver: a working directory and processes on this machine, sandboxed by bubblewrap when present."""
from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import Any

from ..ids import short_id
from .base import OUTPUT_CAP_BYTES, BoxError, BoxInfo, ExecResult

_BOX_ID = re.compile(r"vm_[0-9a-z]{1,40}")
_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
# After the command exits, background children may still hold its pipes; read what is there, then stop.
_PIPE_GRACE_S = 0.2


class LocalBoxDriver:
    """Give each box its own directory under `root`; each exec runs in its own process group tagged with the box id.

    Sandboxing: with bubblewrap (`sandbox="auto"` and `bwrap` works here) the system is read-only, the box
    directory and a private /tmp are writable, capabilities are dropped and the `hide` paths (the hub's
    home: database, tokens) are masked. Without it, commands are plain processes in the box directory.
    Every process carries `AMUX_BOX_ID` in its environment, which is how `destroy` finds the ones that
    left their process group.
    """

    name = "local"

    def __init__(self, root: Path, *, sandbox: str = "auto", hide: list[Path] | None = None,
                 output_cap: int = OUTPUT_CAP_BYTES) -> None:
        if sandbox not in ("auto", "bwrap", "none"):
            raise ValueError("sandbox must be auto, bwrap or none")
        self.root = Path(root).resolve()
        self.hide = [Path(p).resolve() for p in (hide or [])]
        self.output_cap = output_cap
        self._sandbox = sandbox
        self._resolved: str | None = None if sandbox == "auto" else sandbox
        self._groups: dict[str, set[int]] = {}
        self.host = socket.gethostname()

    # --- sandbox -------------------------------------------------------------------------------

    async def sandbox(self) -> str:
        """Return the isolation in use: `bwrap` when bubblewrap is installed and works here, else `none`."""
        if self._resolved is None:
            self._resolved = "bwrap" if await self._bwrap_works() else "none"
        return self._resolved

    async def _bwrap_works(self) -> bool:
        bwrap = shutil.which("bwrap")
        if not bwrap:
            return False
        try:
            proc = await asyncio.create_subprocess_exec(
                bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--cap-drop", "ALL", "true",
                stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
            return await asyncio.wait_for(proc.wait(), 10) == 0
        except (OSError, asyncio.TimeoutError):
            return False

    def _argv(self, mode: str, box_dir: Path, env: dict[str, str], command: str) -> list[str]:
        if mode != "bwrap":
            return ["/bin/sh", "-c", command]
        argv = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        for path in self.hide:
            if path.exists() and path != box_dir and box_dir not in path.parents:
                argv += ["--tmpfs", str(path)]  # the box directory is bound again below, on top
        argv += ["--bind", str(box_dir), str(box_dir), "--chdir", str(box_dir),
                 "--cap-drop", "ALL", "--unshare-ipc", "--unshare-uts", "--hostname", env["AMUX_BOX_ID"].replace("_", "-"),
                 "--clearenv"]
        for k, v in env.items():
            argv += ["--setenv", k, v]
        return argv + ["--", "/bin/sh", "-c", command]

    # --- BoxDriver -----------------------------------------------------------------------------

    def _dir(self, handle: dict[str, Any]) -> tuple[str, Path]:
        box_id = str(handle.get("box_id", ""))
        if not _BOX_ID.fullmatch(box_id):
            raise BoxError("box handle names no box; destroy it with `rift_vm_destroy` and make another with `rift_vm_new`")
        return box_id, self.root / box_id

    def _elsewhere(self, handle: dict[str, Any], box_dir: Path) -> str | None:
        """Say where a box lives when it is not here (another replica's machine), else None."""
        host = handle.get("host")
        if box_dir.is_dir() or not host or host == self.host:
            return None
        return (f"box {handle.get('box_id')} lives on host {host}, and this hub replica runs on {self.host}; "
                f"the local driver serves a box only from its own machine")

    async def create(self, box_id: str) -> dict[str, Any]:
        """Make the box's directory and return its handle."""
        if not _BOX_ID.fullmatch(box_id):
            raise BoxError(f"box id {box_id!r} is not vm_<id>")
        box_dir = self.root / box_id
        self.root.mkdir(parents=True, exist_ok=True)
        try:
            box_dir.mkdir(mode=0o700)
        except FileExistsError as e:
            raise BoxError(f"box {box_id} already exists; make another with `rift_vm_new`") from e
        return {"box_id": box_id, "dir": str(box_dir), "sandbox": await self.sandbox(), "host": self.host}

    async def exec(self, handle: dict[str, Any], command: str, timeout_s: float) -> ExecResult:
        """Run `sh -c command` in the box; kill its process group at the timeout; cap each stream."""
        box_id, box_dir = self._dir(handle)
        if not box_dir.is_dir():
            raise BoxError(self._elsewhere(handle, box_dir) or f"box {box_id} is gone; make another with `rift_vm_new`")
        exec_id = short_id("ex", 10)
        env = {"PATH": _PATH, "HOME": str(box_dir), "LANG": "C.UTF-8", "TERM": "dumb",
               "AMUX_BOX_ID": box_id, "AMUX_EXEC_ID": exec_id}
        argv = self._argv(str(handle.get("sandbox") or await self.sandbox()), box_dir, env, command)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        started = time.monotonic()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv, stdin=asyncio.subprocess.DEVNULL, stdout=out_w, stderr=err_w, cwd=box_dir, env=env,
                start_new_session=True)
        except OSError as e:
            os.close(out_r)
            os.close(err_r)
            raise BoxError(f"could not start the command in box {box_id}: {e.strerror}") from e
        finally:
            os.close(out_w)
            os.close(err_w)
        self._groups.setdefault(box_id, set()).add(proc.pid)
        readers = [asyncio.create_task(self._read_capped(out_r)), asyncio.create_task(self._read_capped(err_r))]
        timed_out = False
        try:
            await asyncio.wait_for(proc.wait(), timeout_s)
        except asyncio.TimeoutError:
            timed_out = True
            await self._kill(exec_marker=("AMUX_EXEC_ID", exec_id), groups=[proc.pid])
            await proc.wait()
        except asyncio.CancelledError:
            await self._kill(exec_marker=("AMUX_EXEC_ID", exec_id), groups=[proc.pid])
            raise
        finally:
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

    async def destroy(self, handle: dict[str, Any]) -> None:
        """Kill every process of the box (its groups, then any process tagged with its id) and remove its directory."""
        box_id, box_dir = self._dir(handle)
        elsewhere = self._elsewhere(handle, box_dir)
        if elsewhere:  # leave it to the replica on that machine
            raise BoxError(elsewhere)
        await self._kill(exec_marker=("AMUX_BOX_ID", box_id), groups=sorted(self._groups.pop(box_id, set())))
        if box_dir.exists():
            await asyncio.to_thread(shutil.rmtree, box_dir, True)

    async def describe(self, handle: dict[str, Any]) -> BoxInfo:
        """Report the box directory, the sandbox and its running processes."""
        box_id, box_dir = self._dir(handle)
        pids = await asyncio.to_thread(_tagged_pids, "AMUX_BOX_ID", box_id)
        return BoxInfo(box_id, self.name, box_dir.is_dir(),
                       {"dir": str(box_dir), "sandbox": handle.get("sandbox"), "processes": len(pids)})

    # --- helpers -------------------------------------------------------------------------------

    async def _read_capped(self, fd: int) -> tuple[bytes, bool]:
        """Read a pipe to its end, keeping the first `output_cap` bytes and draining the rest."""
        loop = asyncio.get_running_loop()
        reader = asyncio.StreamReader(limit=1 << 20)
        transport, _ = await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), os.fdopen(fd, "rb", 0))
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
