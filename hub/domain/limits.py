"""Resource limits of a task child (README "Resource limits"): memory, processes and threads, CPU (pure).

A runner sets the ceilings (`[runner] memory_max`, `pids_max`, `cpu_max`; `amux runner --memory-max 4GiB …`); a
profile or a task request may ask for lower ones, never higher: the limit a run gets is the lowest of the three.
Admission freezes what the profile and the request asked for in the snapshot (`limits`); the runner applies the
lower of that and its own, and says what it applied and how (cgroup or rlimit) in the run's first status event.
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from typing import Any, Mapping

from ..errors import Invalid

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1000, "kib": 1 << 10, "m": 1 << 20, "mb": 1000 ** 2, "mib": 1 << 20,
          "g": 1 << 30, "gb": 1000 ** 3, "gib": 1 << 30, "t": 1 << 40, "tb": 1000 ** 4, "tib": 1 << 40}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")
MIN_MEMORY = 16 << 20   # below this no engine starts: refused as a mistake
MAX_PIDS = 4_194_304    # the kernel's pid_max ceiling


def parse_size(value: Any, what: str = "memory_max") -> int:
    """Parse a byte size: an integer of bytes, or `4GiB`, `512MiB`, `1.5G` (binary units; `GB`/`MB` decimal)."""
    if isinstance(value, bool):
        raise Invalid(f"{what} {value!r} is not a size; write e.g. 4GiB or 512MiB")
    if isinstance(value, int):
        n = value
    else:
        m = _SIZE.match(str(value))
        unit = m.group(2).lower() if m else None
        if m is None or unit not in _UNITS:
            raise Invalid(f"{what} {value!r} is not a size; write e.g. 4GiB or 512MiB")
        n = int(float(m.group(1)) * _UNITS[unit])
    if n < MIN_MEMORY:
        raise Invalid(f"{what} {value!r} is below {size_text(MIN_MEMORY)}; no engine runs in that; write e.g. 1GiB")
    return n


def size_text(n: int) -> str:
    """Say a byte size the way it is written in the configuration (`4 GiB`, `256 MiB`)."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size and n % (size // 16 or 1) == 0:
            value = n / size
            return f"{value:g} {unit}"
    return f"{n} bytes"


def default_cpus() -> float:
    """The machine's cores less one (at least one)."""
    return float(max(1, (os.cpu_count() or 2) - 1))


def default_limits() -> "Limits":
    """A runner's limits where its operator set none: 4 GiB, 1024 processes and threads, the cores less one."""
    return Limits(4 << 30, 1024, default_cpus())


@dataclass(frozen=True)
class Limits:
    """The three limits of one child; None: not limited (only a request or profile leaves one out)."""

    memory_max: int | None = None     # bytes
    pids_max: int | None = None       # processes and threads
    cpu_max: float | None = None      # cores

    @classmethod
    def parse(cls, data: Mapping[str, Any] | None, what: str = "limits") -> "Limits":
        """Read limits from a request, a profile or a snapshot, refusing bad values with the fix."""
        if data is None:
            return cls()
        if not isinstance(data, Mapping):
            raise Invalid(f"{what} must be an object such as {{\"memory_max\": \"2GiB\", \"pids_max\": 256, "
                          f"\"cpu_max\": 1.5}}")
        unknown = sorted(set(data) - {"memory_max", "pids_max", "cpu_max"})
        if unknown:
            raise Invalid(f"{what} has no {unknown[0]!r}; it takes memory_max, pids_max and cpu_max")
        memory = data.get("memory_max")
        pids = data.get("pids_max")
        cpus = data.get("cpu_max")
        if pids is not None and (isinstance(pids, bool) or not isinstance(pids, int) or not 1 <= pids <= MAX_PIDS):
            raise Invalid(f"{what}.pids_max {pids!r} must be a whole number from 1 to {MAX_PIDS}, e.g. 512")
        if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, (int, float))
                                 or not 0.01 <= cpus <= 4096):
            raise Invalid(f"{what}.cpu_max {cpus!r} must be a number of cores from 0.01 to 4096, e.g. 1.5")
        return cls(None if memory is None else parse_size(memory, f"{what}.memory_max"),
                   pids, None if cpus is None else float(cpus))

    def lowest(self, other: "Limits") -> "Limits":
        """Return, limit by limit, the lower of the two (an unset one takes the other's)."""
        def low(a: Any, b: Any) -> Any:
            return b if a is None else a if b is None else min(a, b)
        return Limits(low(self.memory_max, other.memory_max), low(self.pids_max, other.pids_max),
                      low(self.cpu_max, other.cpu_max))

    def otherwise(self, other: "Limits") -> "Limits":
        """Return each limit set here, else `other`'s (an operator's settings over the defaults)."""
        return Limits(self.memory_max if self.memory_max is not None else other.memory_max,
                      self.pids_max if self.pids_max is not None else other.pids_max,
                      self.cpu_max if self.cpu_max is not None else other.cpu_max)

    def snapshot(self) -> dict[str, Any] | None:
        """The form frozen in a snapshot and shown in views (bytes, a count, cores); None when nothing is set."""
        data = {k: v for k, v in asdict(self).items() if v is not None}
        return data or None

    def text(self) -> str:
        """Say the limits for a person: `memory 256 MiB, 128 processes, 1.5 CPUs`."""
        parts = []
        if self.memory_max is not None:
            parts.append(f"memory {size_text(self.memory_max)}")
        if self.pids_max is not None:
            parts.append(f"{self.pids_max} processes")
        if self.cpu_max is not None:
            parts.append(f"{self.cpu_max:g} CPUs")
        return ", ".join(parts) or "no limits"


def memory_reached(limit: int) -> str:
    """The error of a run killed at its memory limit (as Kubernetes says OOMKilled)."""
    return f"memory limit {size_text(limit)} reached: the run's processes were killed (OOMKilled)"


def pids_reached(limit: int) -> str:
    """The status of a run whose forks fail at its process limit (it keeps running)."""
    return f"process limit {limit} reached: new processes and threads fail until some exit"


def applied_limits(snapshot: Mapping[str, Any], capabilities: Mapping[str, Any]) -> dict[str, Any] | None:
    """The limits a run's child gets on a runtime, as its runner computes them: the lower of the snapshot's and
    the runtime's, with how the runtime enforces each. None without a child or before placement."""
    offered = capabilities.get("limits")
    if not isinstance(offered, Mapping) or snapshot.get("isolation") is None:
        return None
    ceiling = Limits.parse({k: offered[k] for k in ("memory_max", "pids_max", "cpu_max") if k in offered})
    applied = ceiling.lowest(Limits.parse(snapshot.get("limits")))
    return {**(applied.snapshot() or {}), "mechanism": dict(offered.get("mechanism") or {})}


def limits_text(view: Mapping[str, Any]) -> str:
    """Say a view's limits (`applied_limits`) for a person, with how each is enforced."""
    text = Limits.parse({k: view[k] for k in ("memory_max", "pids_max", "cpu_max") if view.get(k) is not None}).text()
    how = view.get("mechanism") or {}
    return text + (f" ({', '.join(f'{k}: {v}' for k, v in how.items())})" if how else "")
