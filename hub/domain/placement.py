"""Placement rules: which runtime may take a run, and why a queued run waits (pure; `now` is not needed).

A runtime here is anything with `name`, `status`, `capabilities`, `shared` and `principal_id` (a runtime row);
a run is its frozen snapshot and its owner. Every run is checked the same way, a named runtime or not.
"""
from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Iterable, Mapping

from .isolation import frozen_mode, needs_boundary, offered, why_not

# The platforms amux launches agents on (seed: runtime admission validates platform support before launch).
LAUNCH_PLATFORMS = ("darwin", "linux")
_SHOWN = {"darwin": "macOS", "linux": "linux"}


def launch_platforms(snapshot: Mapping[str, Any]) -> tuple[str, ...]:
    """Return the platforms a run may launch on: those its snapshot froze at admission, else every supported one."""
    frozen = snapshot.get("platforms")
    if isinstance(frozen, list) and frozen:
        return tuple(p for p in frozen if p in LAUNCH_PLATFORMS)
    single = snapshot.get("platform")  # an older snapshot shape naming one platform
    if isinstance(single, str) and single:
        return (single,) if single in LAUNCH_PLATFORMS else ()
    return LAUNCH_PLATFORMS


def platforms_text(platforms: Iterable[str]) -> str:
    """Name platforms as people say them: 'linux or macOS'."""
    names = sorted(_SHOWN.get(p, p) for p in platforms)
    return " or ".join(names) if names else "no platform"


def unfit(snapshot: Mapping[str, Any], owner_id: str, runtime: Any) -> str | None:
    """Say why `runtime`, as registered now, can never take this run (whatever its status); None when it can.

    Checked in order: the requested runtime, the engine, the platform, workspace access, the execution mode the
    snapshot froze, then ownership (a runtime runs its owner's tasks only, unless it is shared).
    """
    caps = runtime.capabilities or {}
    named = snapshot.get("runtime")
    if named and named != runtime.name:
        return f"{runtime.name} is not the requested runtime {named}"
    engine = snapshot.get("engine")
    if engine not in caps.get("engines", []):
        return f"{runtime.name} does not offer engine {engine}"
    platform = caps.get("platform")
    allowed = launch_platforms(snapshot)
    if platform not in allowed:
        return f"{runtime.name} runs on {platform or 'an unreported platform'}; this task launches on " \
               f"{platforms_text(allowed)} only"
    if not caps.get("workspace_writable", False):
        return f"{runtime.name} cannot write its workspace root {caps.get('workspace_root')!r}"
    if needs_boundary(snapshot) and (mode := frozen_mode(snapshot)) not in offered(caps):
        return f"{runtime.name} does not offer isolation {mode}: {why_not(caps, mode)}"
    if not runtime.shared and runtime.principal_id != owner_id:
        return f"{runtime.name} runs only its owner's tasks"
    return None


def waiting_for(snapshot: Mapping[str, Any], owner_id: str, known: list[Any]) -> str:
    """Say why a queued run waits, from every runtime the hub knows (any status)."""
    named = snapshot.get("runtime")
    if named:
        rt = next((r for r in known if r.name == named), None)
        if rt is None:
            return f"waiting for runtime {named}, which is not registered"
        why = unfit(snapshot, owner_id, rt)
        if why is not None:
            return f"runtime {named} can never take it: {why}"
        if rt.status != "online":
            return f"waiting for runtime {named}, {rt.status} since {_since(rt.last_seen_at)}"
        return f"waiting for a free slot on runtime {named}"
    able = [r for r in known if unfit(snapshot, owner_id, r) is None]
    online = [r for r in able if r.status == "online"]
    if online:
        return f"waiting for a free slot ({len(online)} eligible runtime(s) online, all busy)"
    what = f"engine {snapshot.get('engine')} on {platforms_text(launch_platforms(snapshot))}"
    if able:
        return f"waiting for a runtime that offers {what}; {', '.join(r.name for r in able)} offline"
    # Name the runtimes that offer the engine but can't take it; other principals' private ones stay unnamed.
    reasons = [why for r in known if (r.shared or r.principal_id == owner_id)
               and snapshot.get("engine") in (r.capabilities or {}).get("engines", [])
               and (why := unfit(snapshot, owner_id, r)) is not None]
    if reasons:
        return f"waiting for a runtime that offers {what}; none can take it: {'; '.join(reasons)}"
    return f"waiting for a runtime that offers {what}; none is registered for this task's owner"


def _since(when: datetime | None) -> str:
    if when is None:
        return "its registration"
    return (when if when.tzinfo else when.replace(tzinfo=timezone.utc)).isoformat()
