"""The `local` box driver: each box a long-lived bubblewrap sandbox on this machine (or, by the operator's
explicit choice, plain unsandboxed processes in a directory)."""
from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from ..config import BoxSettings
from ..ids import short_id
from . import bwrap as bw
from .base import OUTPUT_CAP_BYTES, BoxError, BoxInfo, ExecResult
from .limits import Limits, enforcement, enter, existing_cgroups, remove_cgroups, setup_cgroups
from .uids import UidClaims

log = logging.getLogger(__name__)

_BOX_ID = re.compile(r"vm_[0-9a-z]{1,40}")
_PATH = bw.PATH
# After the command exits, background children may still hold its pipes; read what is there, then stop.
_PIPE_GRACE_S = 0.2
_START_TIMEOUT_S = 15.0
_NS_GET_PARENT = 0xB702  # ioctl: the parent of a user namespace (linux/nsfs.h)

NO_SANDBOX_RECORD = ("box {box_id} has no sandbox record (its stored handle names neither a bubblewrap init nor the "
                     "operator's boxes.driver = \"unsandboxed\"), so nothing runs in it; `rift_vm_destroy` it and "
                     "make another with `rift_vm_new`")
NO_BWRAP = ("bubblewrap (`bwrap`) is not installed on this hub's machine, so boxes cannot be sandboxed; "
            "the operator installs it (`apt-get install bubblewrap`), or sets boxes.driver = \"unsandboxed\" "
            "(AMUX_BOXES__DRIVER=unsandboxed) to run boxes without isolation")


class LocalBoxDriver:
    """Run each box as a long-lived bubblewrap sandbox (`boxes.driver = "local"`), or unsandboxed if the operator says.

    Sandboxed: the box's init is `bwrap --unshare-all` (own user, PID, mount, IPC, UTS, cgroup and, unless
    `boxes.network = "host"`, network namespaces), started detached so it outlives a hub restart; root inside
    maps to an unprivileged uid outside; it sees the system read-only and writes only its own /box and /tmp
    (size-capped tmpfs). `exec` enters that init's namespaces with `nsenter`, so background processes stay
    in the box between commands and die with it. Memory, process and CPU limits come from a cgroup per box
    (v2, else v1) or, where none is writable, rlimits. Everything is rebuilt from the stored handle.

    Unsandboxed: a directory and plain processes tagged with `AMUX_BOX_ID` (how `destroy` finds them), only for a
    box whose handle says `"sandbox": "none"` (made under the operator's `boxes.driver = "unsandboxed"`); a handle
    that names no sandbox runs nothing.

    When the hub runs as root, each box runs as a host uid of its own, claimed in `uids` (hub/boxes/uids.py).
    """

    def __init__(self, root: Path, settings: BoxSettings | None = None, *, hide: list[Path] | None = None,
                 output_cap: int = OUTPUT_CAP_BYTES, uids: UidClaims | None = None) -> None:
        self.settings = settings or BoxSettings()
        self.sandboxed = self.settings.driver == "local"
        self.name = self.settings.driver
        self.root = Path(root).resolve()
        self.hide = [Path(p).resolve() for p in (hide or [])] + [self.root]
        self.output_cap = output_cap
        self.uids = uids or UidClaims()
        self._groups: dict[str, set[int]] = {}
        self.host = socket.gethostname()

    @property
    def limits(self) -> Limits:
        """Return the per-box limits of the settings."""
        return Limits(self.settings.memory_mb, self.settings.pids_max, self.settings.cpus)

    # --- BoxDriver -----------------------------------------------------------------------------

    def _dir(self, handle: dict[str, Any]) -> tuple[str, Path]:
        box_id = str(handle.get("box_id", ""))
        if not _BOX_ID.fullmatch(box_id):
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

    def provisional(self, box_id: str) -> dict[str, Any]:
        """Return the handle of a box being made: enough for `destroy` to find whatever `create` left."""
        return {"box_id": box_id, "host": self.host, "dir": str(self.root / box_id)}

    async def create(self, box_id: str) -> dict[str, Any]:
        """Make the box (its directory and, sandboxed, its running init) and return its handle."""
        if not _BOX_ID.fullmatch(box_id):
            raise BoxError(f"box id {box_id!r} is not vm_<id>")
        box_dir = self.root / box_id
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        try:
            box_dir.mkdir(mode=0o700)
        except FileExistsError as e:
            raise BoxError(f"box {box_id} already exists; make another with `rift_vm_new`") from e
        if not self.sandboxed:
            return {**self.provisional(box_id), "sandbox": "none"}
        try:
            return await self._start(box_id, box_dir)
        except BaseException:
            await self.destroy(self.provisional(box_id))
            raise

    async def _start(self, box_id: str, box_dir: Path) -> dict[str, Any]:
        """Start the box's init and return the handle that finds it again."""
        bwrap = shutil.which("bwrap")  # looked up for every box: installing it later needs no restart
        if not bwrap:
            raise BoxError(NO_BWRAP)
        for tool in ("nsenter", "setpriv", "setsid"):
            if not shutil.which(tool):
                raise BoxError(f"`{tool}` is missing on this hub's machine; the operator installs util-linux")
        limits = self.limits
        # Released by `destroy`, which `create` calls when this fails.
        uid = await asyncio.to_thread(self.uids.claim, box_id) if os.geteuid() == 0 else None
        cgroups = await asyncio.to_thread(setup_cgroups, box_id, limits)
        info_r, info_w = os.pipe()
        argv = bw.init_argv(bwrap, box_id, network=self.settings.network, disk_bytes=self.settings.disk_mb << 20,
                            shm_bytes=self.settings.shm_mb << 20, hide=self.hide, info_fd=info_w)

        def prepare() -> None:  # in the forked child: limits first (as root), then the unprivileged uid
            enter(cgroups, limits, nproc=uid is not None)
            if uid is not None:
                os.setgroups([])
                os.setgid(uid)
                os.setuid(uid)

        log_path = box_dir / "init.log"
        try:
            with open(log_path, "wb") as errf:
                proc = await asyncio.create_subprocess_exec(
                    "setsid", "-f", *argv, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL,
                    stderr=errf, pass_fds=(info_w,), preexec_fn=prepare, cwd="/",
                    env={"PATH": _PATH, "LANG": "C.UTF-8", "AMUX_BOX_ID": box_id})
            os.close(info_w)
            info_w = -1
            await proc.wait()
            info = await asyncio.wait_for(asyncio.to_thread(_read_json, info_r), _START_TIMEOUT_S)
        except (OSError, asyncio.TimeoutError) as e:
            raise BoxError(f"bubblewrap could not start box {box_id} ({e}); {self._fix()}") from e
        finally:
            if info_w >= 0:
                os.close(info_w)
            os.close(info_r)
        pid = info.get("child-pid") if info else None
        start = _start_time(pid) if isinstance(pid, int) else None
        if isinstance(pid, int) and start is not None and not await _settled(pid, start):
            start = None
        if start is None:
            detail = log_path.read_text(errors="replace").strip()[-400:] if log_path.exists() else ""
            raise BoxError(f"bubblewrap could not sandbox box {box_id} on this machine ({detail or 'no output'}); "
                           f"{self._fix()}")
        return {**self.provisional(box_id), "sandbox": "bwrap", "init_pid": pid, "init_start": start, "uid": uid,
                "network": self.settings.network, "cgroups": cgroups, "limits": enforcement(cgroups)}

    @staticmethod
    def _fix() -> str:
        return ("the operator makes user namespaces available to bubblewrap (sysctl user.max_user_namespaces), "
                "or sets boxes.driver = \"unsandboxed\" (AMUX_BOXES__DRIVER=unsandboxed) to run boxes "
                "without isolation")

    def _init_pid(self, handle: dict[str, Any], box_id: str) -> int:
        """Return the pid of the box's running init, or refuse when it is gone or its handle never named one."""
        pid, start = handle.get("init_pid"), handle.get("init_start")
        if not isinstance(pid, int) or not isinstance(start, int):
            raise BoxError(NO_SANDBOX_RECORD.format(box_id=box_id))
        if _start_time(pid) != start:
            raise BoxError(f"box {box_id} is no longer running (its sandbox stopped, e.g. the machine restarted); "
                           f"`rift_vm_destroy` it and make another with `rift_vm_new`")
        return pid

    async def exec(self, handle: dict[str, Any], command: str, timeout_s: float) -> ExecResult:
        """Run `sh -c command` in the box; kill what it started at the timeout; cap each stream."""
        box_id, box_dir = self._dir(handle)
        if not box_dir.is_dir():
            raise BoxError(self._elsewhere(handle, box_dir) or f"box {box_id} is gone; make another with `rift_vm_new`")
        exec_id = short_id("ex", 10)
        sandbox = handle.get("sandbox")
        if sandbox not in ("bwrap", "none"):  # fail closed: only the operator's explicit choice runs on the host
            raise BoxError(NO_SANDBOX_RECORD.format(box_id=box_id))
        sandboxed = sandbox == "bwrap"
        env = {"PATH": _PATH, "HOME": bw.BOX_HOME if sandboxed else str(box_dir), "LANG": "C.UTF-8", "TERM": "dumb",
               "AMUX_BOX_ID": box_id, "AMUX_EXEC_ID": exec_id}
        preexec = None
        counter: Path | None = None
        stdin: int | None = None
        if sandboxed:
            pid = self._init_pid(handle, box_id)
            as_owner = os.geteuid() != 0
            argv = bw.enter_argv(pid, command, as_owner=as_owner)
            stdin = _outer_userns(pid, box_id) if as_owner else None
            cgroups, limits, nproc = dict(handle.get("cgroups") or {}), self.limits, handle.get("uid") is not None
            preexec = lambda: enter(cgroups, limits, nproc=nproc)  # noqa: E731
            cwd = "/"
            counter = Path(cgroups["pids"], "pids.current") if cgroups.get("pids") else None
        else:
            argv, cwd = ["/bin/sh", "-c", command], str(box_dir)
        return await self._run(box_id, exec_id, argv, env, cwd, preexec, timeout_s, counter, stdin)

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
            await asyncio.wait_for(proc.wait(), timeout_s)
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

    async def destroy(self, handle: dict[str, Any]) -> None:
        """Kill every process of the box (its init, so the kernel ends the rest; then anything tagged with its id),
        remove its cgroups and its directory."""
        box_id, box_dir = self._dir(handle)
        elsewhere = self._elsewhere(handle, box_dir)
        if elsewhere:  # leave it to the replica on that machine
            raise BoxError(elsewhere)
        pid = handle.get("init_pid")
        if isinstance(pid, int) and handle.get("init_start") is not None and _start_time(pid) == handle["init_start"]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)  # pid 1 of the box: the kernel kills everything in its PID namespace
            await _reaped_init(pid, handle["init_start"])  # before its uid is given back
        await self._kill(exec_marker=("AMUX_BOX_ID", box_id), groups=sorted(self._groups.pop(box_id, set())))
        cgroups = handle.get("cgroups") or await asyncio.to_thread(existing_cgroups, box_id)
        if cgroups:
            await asyncio.to_thread(remove_cgroups, cgroups)
        if box_dir.exists():
            await asyncio.to_thread(shutil.rmtree, box_dir, True)
        if handle.get("sandbox") != "none":  # last: nothing of the box is left to run as this uid
            await asyncio.to_thread(self.uids.release, box_id, handle.get("uid"))

    async def describe(self, handle: dict[str, Any]) -> BoxInfo:
        """Report whether the box runs, how it is isolated and limited, and its process count."""
        box_id, box_dir = self._dir(handle)
        sandboxed = handle.get("sandbox") == "bwrap"
        if sandboxed:
            pid = handle.get("init_pid")
            alive = box_dir.is_dir() and isinstance(pid, int) and _start_time(pid) == handle.get("init_start")
            pids = await asyncio.to_thread(_namespace_pids, pid) if alive and isinstance(pid, int) else []
        else:  # a handle without its sandbox record runs nothing (`exec`), so it is not a live box either
            alive = box_dir.is_dir() and handle.get("sandbox") == "none"
            pids = await asyncio.to_thread(_tagged_pids, "AMUX_BOX_ID", box_id)
        return BoxInfo(box_id, handle.get("driver") or self.name, alive,
                       {"dir": str(box_dir), "sandbox": handle.get("sandbox"), "processes": len(pids),
                        "network": handle.get("network"), "limits": handle.get("limits"), "uid": handle.get("uid")})

    # --- helpers -------------------------------------------------------------------------------

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


async def _reaped_init(pid: int, start: int, within_s: float = 2.0) -> None:
    """Wait, at most `within_s`, until a killed box init is reaped: its PID namespace's processes are gone first."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            return
        if int(stat.rsplit(")", 1)[1].split()[19]) != start:  # the pid names another process now
            return
        await asyncio.sleep(0.005)


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


def _namespace_pids(init_pid: int) -> list[int]:
    """Return the processes in the PID namespace whose init is `init_pid` (seen from the host)."""
    try:
        ns = os.readlink(f"/proc/{init_pid}/ns/pid")
    except OSError:
        return []
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry.name}/ns/pid") == ns:
                    found.append(int(entry.name))
    return found


async def _settled(init_pid: int, start: int, within_s: float = _START_TIMEOUT_S) -> bool:
    """Wait until a box's init has started the box's first process: bwrap reports the init's pid before it has
    moved into its nested user namespace and finished the mounts; False when the init died first."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if _start_time(init_pid) != start:
            return False
        with contextlib.suppress(OSError):
            if Path(f"/proc/{init_pid}/task/{init_pid}/children").read_text().strip():
                return True
        await asyncio.sleep(0.005)
    return False


def _outer_userns(init_pid: int, box_id: str) -> int:
    """Open the user namespace that owns a box's namespaces: the parent of its init's (bwrap's `--disable-userns`)."""
    try:
        fd = os.open(f"/proc/{init_pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        raise BoxError(f"box {box_id} is no longer running ({e}); `rift_vm_destroy` it and make another with "
                       f"`rift_vm_new`") from e
    try:
        return fcntl.ioctl(fd, _NS_GET_PARENT)
    except OSError as e:
        raise BoxError(f"this hub is not root and cannot enter box {box_id} ({e}: the kernel needs NS_GET_PARENT, "
                       f"Linux 4.9 or later); the operator runs the hub as root or on a newer kernel, then "
                       f"`rift_vm_destroy` it and make another with `rift_vm_new`") from e
    finally:
        os.close(fd)


def _read_json(fd: int) -> dict[str, Any] | None:
    """Read one JSON object from a pipe (bubblewrap's --info-fd); None at end of file without one."""
    buf = b""
    while chunk := os.read(fd, 4096):
        buf += chunk
        with contextlib.suppress(ValueError):
            return json.loads(buf)
    return None
