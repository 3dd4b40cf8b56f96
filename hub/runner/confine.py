"""How much a task child may use (README "Resource limits"): the run's cgroup, made before the child starts and
removed when the run ends, or rlimits where this runner can make no cgroup; and the watch that turns the limits'
events into what a person sees (a run at its memory limit is killed whole and fails naming it; one at its process
limit keeps running and says so once).

The mechanism is chosen once per runner (`mechanism`): as root, a cgroup per run nested under the runner's own (v2
where the machine runs it, else v1); as another user, a cgroup under a delegated group the operator named
(`--cgroup-parent`) when it is writable; else rlimits on each child (`RLIMIT_DATA` per process, `RLIMIT_NPROC`
counted per uid in the child's user namespace, `RLIMIT_CPU` as a backstop), which bound one process's memory, not
the tree's, and cannot throttle CPU.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import resource
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from ..boxes import limits as cg
from ..domain.limits import Limits, memory_reached, pids_reached

WATCH_S = 0.2  # how often a run's group is read for an OOM kill or a refused fork


def _cgroup_limits(limits: Limits) -> cg.Limits:
    assert limits.memory_max is not None and limits.pids_max is not None and limits.cpu_max is not None
    return cg.Limits(limits.memory_max, limits.pids_max, limits.cpu_max)


# What stands in for a controller no cgroup provides. RLIMIT_DATA, not RLIMIT_AS: Node's V8 (Claude Code, Pi)
# and Go reserve far more address space than they use, and fail to start under an address-space limit.
RLIMITS = {"memory": "rlimit-data (per process)", "pids": "rlimit-nproc (per uid in the child's user namespace)",
           "cpu": "rlimit-cpu (a backstop: CPU seconds, no throttling)"}


def mechanism(limits: Limits, parent_root: Path | None = None) -> dict[str, str]:
    """Say how this runner enforces each limit ({memory, pids, cpu}: cgroup-v2 | cgroup-v1 | an rlimit), by making
    (and removing) a probe group once."""
    groups: dict[str, str] = {}
    if os.geteuid() == 0 or parent_root is not None:
        groups = cg.setup_cgroups(f"probe-{os.getpid()}", _cgroup_limits(limits), cg.RUNS, parent_root)
        cg.remove_cgroups(groups)
    kind = cg.enforcement(groups)
    return {c: kind[c] if c in groups else RLIMITS[c] for c in ("memory", "pids", "cpu")}


@dataclass
class Confinement:
    """One run's limits as applied: its cgroups ({controller: directory}; empty with rlimits alone)."""

    limits: Limits
    cgroups: dict[str, str] = field(default_factory=dict)
    cpu_seconds: int | None = None  # RLIMIT_CPU backstop (rlimits only): the run's timeout times its cores

    def enter(self) -> None:
        """In the forked child, before it execs anything: join the run's cgroups, or set the rlimits."""
        if self.cgroups:
            cg.enter(self.cgroups, _cgroup_limits(self.limits), nproc=False)
            missing = {"memory", "pids"} - set(self.cgroups)
            if not missing:
                return
        if self.limits.memory_max is not None and "memory" not in self.cgroups:
            resource.setrlimit(resource.RLIMIT_DATA, (self.limits.memory_max, self.limits.memory_max))
        if self.limits.pids_max is not None and "pids" not in self.cgroups:
            resource.setrlimit(resource.RLIMIT_NPROC, (self.limits.pids_max, self.limits.pids_max))
        if self.cpu_seconds is not None and "cpu" not in self.cgroups:
            resource.setrlimit(resource.RLIMIT_CPU, (self.cpu_seconds, self.cpu_seconds))



def start(run_id: str, limits: Limits, how: dict[str, str], timeout_s: float,
          parent_root: Path | None = None) -> Confinement:
    """Make the run's cgroups (where this runner makes any) before its child starts."""
    groups: dict[str, str] = {}
    if any(v.startswith("cgroup") for v in how.values()):
        groups = cg.setup_cgroups(run_id, _cgroup_limits(limits), cg.RUNS, parent_root)
    backstop = None
    if "cpu" not in groups and limits.cpu_max is not None:
        backstop = max(60, int(timeout_s * limits.cpu_max) + 60)
    return Confinement(limits, groups, backstop)


def end(c: Confinement) -> None:
    """Kill what is left of the run in its groups and remove them."""
    if c.cgroups:
        cg.remove_cgroups(c.cgroups)


class Watch:
    """Read a run's groups while it runs: an OOM kill kills the whole group and marks the run; the first refused
    fork is said once."""

    def __init__(self, c: Confinement, record: Callable[[str, dict], None]) -> None:
        self.c = c
        self.record = record
        self.oom = False
        self._forks_said = False

    def check(self) -> None:
        """One look at the groups (also made once more when the run ends)."""
        if not self.c.cgroups:
            return
        if not self.oom and cg.oom_kills(self.c.cgroups) > 0:
            self.oom = True
            cg.kill_all(self.c.cgroups)  # the whole tree, as memory.oom.group does on v2
        if not self._forks_said and self.c.limits.pids_max is not None and cg.fork_refusals(self.c.cgroups) > 0:
            self._forks_said = True
            self.record("status", {"text": pids_reached(self.c.limits.pids_max),
                                   "limit": {"pids_max": self.c.limits.pids_max}})

    async def run(self) -> None:
        """Look every WATCH_S until cancelled."""
        if not self.c.cgroups:
            return
        while True:
            await asyncio.sleep(WATCH_S)
            with contextlib.suppress(OSError):
                self.check()  # a few small reads of /sys/fs/cgroup: microseconds, no thread needed

    def error(self) -> str | None:
        """The run's error when its memory limit killed it."""
        if self.oom and self.c.limits.memory_max is not None:
            return memory_reached(self.c.limits.memory_max)
        return None
