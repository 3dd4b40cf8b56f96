"""Execution modes (DESIGN §8): how a task child is separated from the runner, the hub and other principals (pure).

`linux-dac`: each principal's children run under a uid of their own, in mount and PID namespaces that show the
run's workspace, the principal's private home and the system read-only (a root runner). `userns`: the same view in
new user, mount, PID, IPC, UTS and network namespaces, as the runner's own uid outside (a runner that is not root:
the principals are kept apart by the mount and PID namespaces alone). `process`: the runner's own uid, only on a
runner the operator declared dedicated. A runtime advertises the modes it offers (`capabilities.isolation`) and,
for each mode it does not offer, why (`capabilities.isolation_unavailable`); admission freezes one mode in the
snapshot (`isolation`) and placement matches it.
"""
from __future__ import annotations

from typing import Any, Iterable, Mapping

LINUX_DAC = "linux-dac"
USERNS = "userns"
PROCESS = "process"
MODES = (LINUX_DAC, USERNS, PROCESS)
CONTAINED = (LINUX_DAC, USERNS)  # the modes that keep a child from the runner's files and processes
DEFAULT_ORDER = (LINUX_DAC, USERNS, PROCESS)  # an omitted mode takes the first one a runtime offers, in this order

NO_BWRAP = "bubblewrap is not installed on the runner (`apt-get install bubblewrap`)"
NOT_ROOT = ("the runner is not root, so it cannot run children under uids of their own (it offers the rootless "
            "mode userns instead; run `amux runner` as root for linux-dac)")
ROOT_HAS_DAC = "the runner is root: it runs children under uids of their own (linux-dac) instead"
NOT_DEDICATED = ("the operator has not declared this runner dedicated (`amux runner --dedicated`, or "
                 "`runner.dedicated = true` for the runner of `amux up`)")
SHARES_HUB = ("the runner shares the hub's {what}, so its children could read the hub's secrets; run the runner "
              "as another user or on another machine, or allow it explicitly with "
              "`execution.allow_process_on_hub = true` (AMUX_EXECUTION__ALLOW_PROCESS_ON_HUB=1)")


def needs_boundary(snapshot: Mapping[str, Any]) -> bool:
    """Say whether a run launches a child process the mode must separate (the in-process scripted engine does not:
    it runs the hub's own interpreter over a script, no agent code)."""
    return not (snapshot.get("engine") == "scripted" and not snapshot.get("subprocess"))


def runs_as_principal(snapshot: Mapping[str, Any]) -> bool:
    """Say whether a run's child runs under its owner's own uid (linux-dac), so it needs one allocated."""
    return needs_boundary(snapshot) and frozen_mode(snapshot) == LINUX_DAC


def offered(capabilities: Mapping[str, Any] | None) -> list[str]:
    """Return the modes a runtime offers; a runner from before modes existed offers `process`."""
    caps = capabilities or {}
    modes = caps.get("isolation")
    if not isinstance(modes, list):
        return [PROCESS]
    return [m for m in modes if m in MODES]


def why_not(capabilities: Mapping[str, Any] | None, mode: str) -> str:
    """Say why a runtime does not offer `mode` (what it reported, else a generic reason)."""
    reasons = (capabilities or {}).get("isolation_unavailable") or {}
    return str(reasons.get(mode) or f"it does not offer {mode}")


def frozen_mode(snapshot: Mapping[str, Any]) -> str:
    """Return the mode a snapshot froze; snapshots from before modes existed ran as `process`."""
    mode = snapshot.get("isolation")
    return mode if mode in MODES else PROCESS


def default_mode(runtimes_caps: Iterable[Mapping[str, Any] | None]) -> str:
    """Choose the mode for a submission that names none: the strongest one some eligible runtime offers
    (`linux-dac` wherever a runner can provide it, else `userns`); `linux-dac` when none offers any (admission
    refuses it when a runtime says why it cannot, see `no_mode_text`; with no runtime at all, the run waits)."""
    offers = {m for caps in runtimes_caps for m in offered(caps)}
    return next((m for m in DEFAULT_ORDER if m in offers), LINUX_DAC)


def shares_hub(capabilities: Mapping[str, Any], hub_host: str, hub_uid: int) -> str | None:
    """Say what a runner shares with this hub replica (`process`, `uid`), or None."""
    if capabilities.get("in_hub_process"):
        return "process"
    if capabilities.get("host") == hub_host and capabilities.get("uid") == hub_uid:
        return "uid"
    return None


def admit_process(capabilities: dict[str, Any], hub_host: str, hub_uid: int, allow_on_hub: bool) -> dict[str, Any]:
    """Return the capabilities a registration keeps: `process` is withdrawn from a runner that shares the hub's
    process or uid, unless the operator allowed it (`execution.allow_process_on_hub`)."""
    modes = offered(capabilities)
    shared = shares_hub(capabilities, hub_host, hub_uid)
    if PROCESS not in modes or shared is None or allow_on_hub:
        return capabilities
    unavailable = dict(capabilities.get("isolation_unavailable") or {})
    unavailable[PROCESS] = SHARES_HUB.format(what=shared)
    return {**capabilities, "isolation": [m for m in modes if m != PROCESS], "isolation_unavailable": unavailable}


def uid_exhausted_text(base: int, count: int) -> str:
    """The waiting reason of a linux-dac run whose owner has no uid left in the range."""
    return (f"waiting for a linux-dac uid: the range {base}-{base + count - 1} (execution.uid_base, "
            f"execution.uid_count) is exhausted; the operator widens it")


def no_mode_text(engine: str, capabilities: Iterable[Mapping[str, Any] | None]) -> str:
    """Say why no runtime that runs `engine` can contain a child, from what the runtimes reported, with the fix."""
    reasons: list[str] = []
    for caps in capabilities:
        why = (caps or {}).get("isolation_unavailable") or {}
        for mode in MODES:
            text = f"{mode}: {why.get(mode) or 'not offered'}"
            if text not in reasons:
                reasons.append(text)
    return (f"no runtime that runs engine {engine} can run its child in any execution mode ({'; '.join(reasons)}); "
            "fix the runner as named, or run it as root for linux-dac")
