"""Placement rules (hub/domain/placement.py): every run is checked for engine, platform, workspace and owner."""
from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import pytest

from hub.domain.placement import LAUNCH_PLATFORMS, launch_platforms, unfit, waiting_for

CAPS = {"platform": "linux", "engines": ["claude"], "workspace_root": "/srv/ws", "workspace_writable": True}
SNAP = {"engine": "claude", "runtime": None, "platforms": list(LAUNCH_PLATFORMS)}
SEEN = datetime(2026, 1, 5, 9, 0, tzinfo=timezone.utc)


@dataclass
class Rt:
    name: str
    capabilities: dict[str, Any] = field(default_factory=lambda: dict(CAPS))
    status: str = "online"
    shared: bool = True
    principal_id: str = "pr_ops"
    last_seen_at: datetime | None = SEEN


@pytest.mark.parametrize("snap, rt, why", [
    # fits: a shared linux runtime offering the engine with a writable workspace
    (SNAP, Rt("a"), None),
    (SNAP, Rt("mac", {**CAPS, "platform": "darwin"}), None),
    # a named runtime takes only its own runs
    ({**SNAP, "runtime": "b"}, Rt("a"), "a is not the requested runtime b"),
    (SNAP, Rt("a", {**CAPS, "engines": ["codex"]}), "a does not offer engine claude"),
    # platform is checked without a named runtime too (a task was placed on windows)
    (SNAP, Rt("win", {**CAPS, "platform": "windows"}),
     "win runs on windows; this task launches on linux or macOS only"),
    (SNAP, Rt("x", {**CAPS, "platform": None}), "x runs on an unreported platform"),
    # workspace access
    (SNAP, Rt("ro", {**CAPS, "workspace_writable": False}), "ro cannot write its workspace root '/srv/ws'"),
    # another principal's private runtime
    (SNAP, Rt("mine", shared=False, principal_id="pr_bob"), "mine runs only its owner's tasks"),
    (SNAP, Rt("own", shared=False, principal_id="pr_alice"), None),
    # an older snapshot without frozen platforms still never lands on an unsupported platform
    ({"engine": "claude"}, Rt("win", {**CAPS, "platform": "windows"}), "win runs on windows"),
    ({"engine": "claude", "platform": "darwin"}, Rt("a"), "a runs on linux; this task launches on macOS only"),
])
def test_unfit_says_why_a_runtime_can_never_take_a_run(snap, rt, why):
    got = unfit(snap, "pr_alice", rt)
    assert got == why if why is None else got is not None and got.startswith(why)


def test_frozen_platforms_outside_the_launch_platforms_leave_nothing_to_launch_on():
    assert launch_platforms({"platforms": ["windows"]}) == ()
    assert launch_platforms({}) == LAUNCH_PLATFORMS


@pytest.mark.parametrize("snap, known, text", [
    # an unnamed run with an online eligible runtime waits for a slot only
    (SNAP, [Rt("a")], "waiting for a free slot (1 eligible runtime(s) online, all busy)"),
    # eligible ones offline: named
    (SNAP, [Rt("a", status="offline"), Rt("win", {**CAPS, "platform": "windows"})],
     "waiting for a runtime that offers engine claude on linux or macOS; a offline"),
    # only unfit ones online: each reason, without a named runtime
    (SNAP, [Rt("win", {**CAPS, "platform": "windows"}), Rt("ro", {**CAPS, "workspace_writable": False})],
     "waiting for a runtime that offers engine claude on linux or macOS; none can take it: win runs on windows; "
     "this task launches on linux or macOS only; ro cannot write its workspace root '/srv/ws'"),
    # other principals' private runtimes are not named
    (SNAP, [Rt("bobs", shared=False, principal_id="pr_bob")],
     "waiting for a runtime that offers engine claude on linux or macOS; none is registered for this task's owner"),
    (SNAP, [],
     "waiting for a runtime that offers engine claude on linux or macOS; none is registered for this task's owner"),
    # a named runtime: missing, unfit (even while offline), offline, busy
    ({**SNAP, "runtime": "gpu"}, [Rt("a")], "waiting for runtime gpu, which is not registered"),
    ({**SNAP, "runtime": "gpu"}, [Rt("gpu", {**CAPS, "platform": "windows"}, status="offline")],
     "runtime gpu can never take it: gpu runs on windows; this task launches on linux or macOS only"),
    ({**SNAP, "runtime": "gpu"}, [Rt("gpu", status="offline")],
     f"waiting for runtime gpu, offline since {SEEN.isoformat()}"),
    ({**SNAP, "runtime": "gpu"}, [Rt("gpu")], "waiting for a free slot on runtime gpu"),
])
def test_waiting_for_says_why_a_queued_run_waits(snap, known, text):
    assert waiting_for(snap, "pr_alice", known) == text
