"""The `local` box driver: each box a long-lived bubblewrap sandbox on this machine (`boxes.driver = "local"`)."""
from __future__ import annotations

import asyncio
import contextlib
import fcntl
import json
import os
import shutil
import signal
import time
from pathlib import Path
from typing import Any

from ..ids import short_id
from . import bwrap as bw
from .base import BoxError, BoxInfo, ExecResult
from .host import NO_SANDBOX_RECORD, HostBoxes, _start_time
from .limits import enforcement, enter, setup_cgroups

_START_TIMEOUT_S = 15.0
_NS_GET_PARENT = 0xB702  # ioctl: the parent of a user namespace (linux/nsfs.h)

NO_BWRAP = ("bubblewrap (`bwrap`) is not installed on this hub's machine, so boxes cannot be sandboxed; "
            "the operator installs it (`apt-get install bubblewrap`), or sets boxes.driver = \"unsandboxed\" "
            "(AMUX_BOXES__DRIVER=unsandboxed) to run boxes without isolation")


class BubblewrapBoxDriver(HostBoxes):
    """Run each box as a long-lived bubblewrap sandbox.

    The box's init is `bwrap --unshare-all` (own user, PID, mount, IPC, UTS, cgroup and, unless
    `boxes.network = "host"`, network namespaces), started detached so it outlives a hub restart; root inside
    maps to an unprivileged uid outside; it sees the system read-only and writes only its own /box and /tmp
    (size-capped tmpfs). `exec` enters that init's namespaces with `nsenter`, so background processes stay
    in the box between commands and die with it. Memory, process and CPU limits come from a cgroup per box
    (v2, else v1) or, where none is writable, rlimits. Everything is rebuilt from the stored handle
    (`"sandbox": "bwrap"`, the init's pid and start time). When the hub runs as root, each box runs as a host uid
    of its own, claimed in `uids` (hub/boxes/uids.py).
    """

    name = "local"
    sandboxed = True

    async def create(self, box_id: str) -> dict[str, Any]:
        """Make the box's directory, start its init, and return its handle."""
        box_dir = self._make_dir(box_id)
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
                    env={"PATH": bw.PATH, "LANG": "C.UTF-8", "AMUX_BOX_ID": box_id})
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
        if start is not None and isinstance(pid, int) and not await _settled(pid, start):
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
        """Run `sh -c command` inside the box as its root; kill what it started at the timeout; cap each stream."""
        box_id, _ = self.here(handle)
        exec_id = short_id("ex", 10)
        if handle.get("sandbox") != "bwrap":  # fail closed: a handle without its sandbox record runs nothing
            raise BoxError(NO_SANDBOX_RECORD.format(box_id=box_id))
        env = {"PATH": bw.PATH, "HOME": bw.BOX_HOME, "LANG": "C.UTF-8", "TERM": "dumb", "AMUX_BOX_ID": box_id,
               "AMUX_EXEC_ID": exec_id}
        pid = self._init_pid(handle, box_id)
        as_owner = os.geteuid() != 0
        argv = bw.enter_argv(pid, command, as_owner=as_owner)
        stdin = _outer_userns(pid, box_id) if as_owner else None
        cgroups, limits, nproc = dict(handle.get("cgroups") or {}), self.limits, handle.get("uid") is not None
        counter = Path(cgroups["pids"], "pids.current") if cgroups.get("pids") else None
        return await self._run(box_id, exec_id, argv, env, "/", lambda: enter(cgroups, limits, nproc=nproc),
                               timeout_s, counter, stdin)

    async def destroy(self, handle: dict[str, Any]) -> None:
        """Kill the box's init (the kernel then ends every process in its PID namespace), then anything tagged with
        its id; remove its cgroups and directory; give its uid back. Also cleans up a box `create` left half-made."""
        box_id, box_dir = self._local(handle)
        pid = handle.get("init_pid")
        if isinstance(pid, int) and handle.get("init_start") is not None and _start_time(pid) == handle["init_start"]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)  # pid 1 of the box: the kernel kills everything in its PID namespace
            await _reaped_init(pid, handle["init_start"])  # before its uid is given back
        await self._remove(handle, box_id, box_dir)
        # last: nothing of the box is left to run as this uid
        await asyncio.to_thread(self.uids.release, box_id, handle.get("uid"))

    async def describe(self, handle: dict[str, Any]) -> BoxInfo:
        """Report whether the box's init runs, how it is isolated and limited, and its process count."""
        box_id, box_dir = self._dir(handle)
        pid = handle.get("init_pid")
        alive = (handle.get("sandbox") == "bwrap" and box_dir.is_dir() and isinstance(pid, int)
                 and _start_time(pid) == handle.get("init_start"))
        pids = await asyncio.to_thread(_namespace_pids, pid) if alive and isinstance(pid, int) else []
        return BoxInfo(box_id, handle.get("driver") or self.name, alive,
                       {"dir": str(box_dir), "sandbox": handle.get("sandbox"), "processes": len(pids),
                        "network": handle.get("network"), "limits": handle.get("limits"), "uid": handle.get("uid")})

    async def alive(self, handle: dict[str, Any]) -> bool | None:
        """Say whether the box's init still runs (one read of /proc); None when the box lives on another machine."""
        here = self._present(handle)
        if not here:
            return here
        pid, start = handle.get("init_pid"), handle.get("init_start")
        return handle.get("sandbox") == "bwrap" and isinstance(pid, int) and _start_time(pid) == start


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
