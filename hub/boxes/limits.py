"""Per-box resource limits: a cgroup per box (v2, else v1) under the hub's cgroup, rlimits where none is writable."""
from __future__ import annotations

import contextlib
import os
import resource
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CGROUP_ROOT = Path("/sys/fs/cgroup")
GROUP = "amux-boxes"
_CONTROLLERS = ("memory", "pids", "cpu")
_CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class Limits:
    """What one box may use."""

    memory_mb: int
    pids_max: int
    cpus: float

    @property
    def memory_bytes(self) -> int:
        """Return the memory limit in bytes."""
        return self.memory_mb * 1024 * 1024


def _self_paths() -> dict[str, str]:
    """Map each controller (and "" for the v2 unified tree) to this process's cgroup path."""
    paths: dict[str, str] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text().splitlines():
            _, ctrls, path = line.split(":", 2)
            for c in ctrls.split(",") if ctrls else [""]:
                paths[c] = path
    return paths


def _v1_mounts() -> dict[str, Path]:
    """Map each v1 controller to its mount point."""
    mounts: dict[str, Path] = {}
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 4 and parts[2] == "cgroup":
                for opt in parts[3].split(","):
                    if opt in _CONTROLLERS:
                        mounts.setdefault(opt, Path(parts[1]))
    return mounts


def _write(path: Path, value: str) -> None:
    path.write_text(value)


def _v2_setup(box_id: str, limits: Limits) -> dict[str, str] | None:
    """Make a v2 cgroup for the box with every controller limited; None when v2 cannot do it here."""
    if not (CGROUP_ROOT / "cgroup.controllers").exists():
        return None
    base = CGROUP_ROOT / _self_paths().get("", "/").lstrip("/") / GROUP
    try:
        base.mkdir(parents=True, exist_ok=True)
        have = set((base / "cgroup.controllers").read_text().split())
        if not {"memory", "pids", "cpu"} <= have:
            return None
        _write(base / "cgroup.subtree_control", "+memory +pids +cpu")
        group = base / box_id
        group.mkdir(exist_ok=True)
        _write(group / "memory.max", str(limits.memory_bytes))
        with contextlib.suppress(OSError):
            _write(group / "memory.swap.max", "0")
        _write(group / "pids.max", str(limits.pids_max))
        _write(group / "cpu.max", f"{int(limits.cpus * _CPU_PERIOD_US)} {_CPU_PERIOD_US}")
    except OSError:
        return None
    return {"memory": str(group), "pids": str(group), "cpu": str(group)}


def _v1_setup(box_id: str, limits: Limits) -> dict[str, str]:
    """Make a v1 cgroup per controller that is mounted and writable; return the ones made."""
    own, made = _self_paths(), {}
    for ctrl, mount in _v1_mounts().items():
        group = mount / own.get(ctrl, "/").lstrip("/") / GROUP / box_id
        try:
            group.mkdir(parents=True, exist_ok=True)
            if ctrl == "memory":
                _write(group / "memory.limit_in_bytes", str(limits.memory_bytes))
                with contextlib.suppress(OSError):  # swap accounting may be off
                    _write(group / "memory.memsw.limit_in_bytes", str(limits.memory_bytes))
            elif ctrl == "pids":
                _write(group / "pids.max", str(limits.pids_max))
            else:
                _write(group / "cpu.cfs_period_us", str(_CPU_PERIOD_US))
                _write(group / "cpu.cfs_quota_us", str(int(limits.cpus * _CPU_PERIOD_US)))
        except OSError:
            with contextlib.suppress(OSError):
                group.rmdir()
            continue
        made[ctrl] = str(group)
    return made


def setup_cgroups(box_id: str, limits: Limits) -> dict[str, str]:
    """Create the box's cgroups and return {controller: directory}; controllers missing here are left out."""
    return _v2_setup(box_id, limits) or _v1_setup(box_id, limits)


def enforcement(cgroups: dict[str, str]) -> dict[str, str]:
    """Say how each limit is enforced: by a cgroup, or by an rlimit on each process."""
    kind = "cgroup-v2" if any(Path(p, "cgroup.controllers").exists() for p in cgroups.values()) else "cgroup-v1"
    return {"memory": kind if "memory" in cgroups else "rlimit-as (per process)",
            "pids": kind if "pids" in cgroups else "rlimit-nproc",
            "cpu": kind if "cpu" in cgroups else "none (nice 10)"}


def enter(cgroups: dict[str, str], limits: Limits, *, nproc: bool) -> None:
    """Move the calling process into the box's cgroups and set the rlimits that stand in for missing ones.

    Runs in a forked child before exec (a `preexec_fn`): it only writes files and calls setrlimit.
    """
    for path in dict.fromkeys(cgroups.values()):
        _write(Path(path) / "cgroup.procs", str(os.getpid()))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if "memory" not in cgroups:
        resource.setrlimit(resource.RLIMIT_AS, (limits.memory_bytes, limits.memory_bytes))
    if nproc or "pids" not in cgroups:
        # Counted per real uid: exact when each box runs as its own uid.
        resource.setrlimit(resource.RLIMIT_NPROC, (limits.pids_max, limits.pids_max))
    if "cpu" not in cgroups:
        os.nice(10)


def cgroup_pids(cgroups: dict[str, Any]) -> set[int]:
    """Return every process in the box's cgroups."""
    pids: set[int] = set()
    for path in dict.fromkeys(cgroups.values()):
        with contextlib.suppress(OSError, ValueError):
            pids |= {int(p) for p in Path(path, "cgroup.procs").read_text().split()}
    return pids


def remove_cgroups(cgroups: dict[str, Any]) -> None:
    """Kill what is left in the box's cgroups and remove them (a no-op for ones already gone)."""
    for path in dict.fromkeys(cgroups.values()):
        group = Path(path)
        if GROUP not in group.parts:  # only ever a directory this module made
            continue
        for _ in range(100):
            pids = cgroup_pids({"g": str(group)})
            for pid in pids:
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGKILL)
            try:
                group.rmdir()
                break
            except FileNotFoundError:
                break
            except OSError:
                time.sleep(0.01)


def existing_cgroups(box_id: str) -> dict[str, str]:
    """Return the box's cgroups that exist, found from its id alone (for a box whose handle was never stored)."""
    own, found = _self_paths(), {}
    if (CGROUP_ROOT / "cgroup.controllers").exists():
        group = CGROUP_ROOT / own.get("", "/").lstrip("/") / GROUP / box_id
        if group.is_dir():
            return {c: str(group) for c in _CONTROLLERS}
    for ctrl, mount in _v1_mounts().items():
        group = mount / own.get(ctrl, "/").lstrip("/") / GROUP / box_id
        if group.is_dir():
            found[ctrl] = str(group)
    return found
