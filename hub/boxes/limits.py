"""Resource limits of a box or a task run: a cgroup of its own (v2, else v1) nested under this process's own, made
before its first process starts and removed when it ends; rlimits where no cgroup can be made (README "Resource
limits"). Only groups this module made are ever written, limited, emptied or removed: a box's under `amux-boxes`,
a run's under `amux-runs`, and nothing but their first process is ever moved into them."""
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
GROUP = "amux-boxes"     # boxes' groups
RUNS = "amux-runs"       # task runs' groups
GROUPS = (GROUP, RUNS)
_CONTROLLERS = ("memory", "pids", "cpu")
_CPU_PERIOD_US = 100_000


@dataclass(frozen=True)
class Limits:
    """What one box or run may use."""

    memory_bytes: int
    pids_max: int
    cpus: float


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


def _under(mount: Path, own: str, parent_root: Path | None) -> Path:
    """Where groups are made in one hierarchy: this process's own group, or the delegated `parent_root` (relative:
    under this process's own group; absolute: a directory of the hierarchy, with or without its mount)."""
    if parent_root is None:
        return mount / own.lstrip("/")
    if not parent_root.is_absolute():
        return mount / own.lstrip("/") / parent_root
    return parent_root if mount in parent_root.parents else mount / str(parent_root).lstrip("/")


def _v2_setup(box_id: str, limits: Limits, parent: str, parent_root: Path | None) -> dict[str, str] | None:
    """Make a v2 cgroup for the box with every controller limited; None when v2 cannot do it here."""
    if not (CGROUP_ROOT / "cgroup.controllers").exists():
        return None
    base = _under(CGROUP_ROOT, _self_paths().get("", "/"), parent_root) / parent
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
        with contextlib.suppress(OSError):
            _write(group / "memory.oom.group", "1")  # the kernel kills the whole group at the limit
    except OSError:
        return None
    return {"memory": str(group), "pids": str(group), "cpu": str(group)}


def _v1_setup(box_id: str, limits: Limits, parent: str, parent_root: Path | None) -> dict[str, str]:
    """Make a v1 cgroup per controller that is mounted and writable; return the ones made."""
    own, made = _self_paths(), {}
    for ctrl, mount in _v1_mounts().items():
        group = _under(mount, own.get(ctrl, "/"), parent_root) / parent / box_id
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


def setup_cgroups(box_id: str, limits: Limits, parent: str = GROUP, parent_root: Path | None = None) -> dict[str, str]:
    """Create the cgroups of a box (or run, `parent=RUNS`) and return {controller: directory}; controllers missing
    here are left out. They nest under this process's own groups, or under `parent_root`, a group delegated to
    this user: relative, under this process's own group in each hierarchy; absolute, a directory of the hierarchy
    (`/sys/fs/cgroup/…` on v2)."""
    if parent not in GROUPS:
        raise ValueError(f"not a group of amux's: {parent}")
    return _v2_setup(box_id, limits, parent, parent_root) or _v1_setup(box_id, limits, parent, parent_root)


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
        if not any(g in group.parts for g in GROUPS):  # only ever a directory this module made
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
        if group.parent.name in GROUPS:  # the last one out removes the parent group too (busy: others remain)
            with contextlib.suppress(OSError):
                group.parent.rmdir()


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


def limit_files(cgroups: dict[str, str]) -> dict[str, str]:
    """Read back the limits a group holds, {file: value} (what a test checks before a payload runs)."""
    out: dict[str, str] = {}
    for ctrl, path in cgroups.items():
        names = {"memory": ("memory.max", "memory.limit_in_bytes"), "pids": ("pids.max",),
                 "cpu": ("cpu.max", "cpu.cfs_quota_us")}.get(ctrl, ())
        for name in names:
            with contextlib.suppress(OSError):
                out[name] = Path(path, name).read_text().strip()
    return out


def _counter(path: Path, key: str) -> int:
    with contextlib.suppress(OSError, ValueError):
        for line in path.read_text().splitlines():
            name, _, value = line.partition(" ")
            if name == key:
                return int(value)
    return 0


def oom_kills(cgroups: dict[str, str]) -> int:
    """How many processes the kernel killed at the group's memory limit (v2 memory.events, v1 memory.oom_control)."""
    path = cgroups.get("memory")
    if path is None:
        return 0
    if Path(path, "memory.events").exists():
        return _counter(Path(path, "memory.events"), "oom_kill")
    return _counter(Path(path, "memory.oom_control"), "oom_kill")


def fork_refusals(cgroups: dict[str, str]) -> int:
    """How many forks the group's process limit refused (pids.events `max`)."""
    path = cgroups.get("pids")
    return 0 if path is None else _counter(Path(path, "pids.events"), "max")


def kill_all(cgroups: dict[str, str]) -> None:
    """SIGKILL every process in the groups (a run at its memory limit loses its whole tree, as with oom.group)."""
    for pid in cgroup_pids(cgroups):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
