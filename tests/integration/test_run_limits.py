"""No task child can exhaust the machine: a fork storm and a memory hog, each beside a healthy task, in every mode
this machine offers (linux-dac and process as root, userns as an ordinary user with a delegated cgroup and with
rlimits alone).

Safety: every payload is bounded by itself (the storm starts at most 2,000 processes, each exiting within 20 s;
the hog allocates at most 2 GiB, 32 MiB at a time), and the limits under test are far below (64 processes,
256 MiB), so a limit that does not hold is a failed assertion, never a lost machine. Each payload waits for a
`go` file in its workspace: the test first reads the run's cgroup (its limit files, and that the child is in it)
or the child's `/proc/<pid>/limits`, and fails without releasing the payload when they are not what was set.
"""
from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import time
from pathlib import Path

import aiohttp
import pytest

from hub.domain.limits import applied_limits
from hub.services.tasks.service import SubmitRequest
from tests.helpers import eventually
from tests.integration.test_task_child_boundary import BWRAP, dac_hub, out, runner_process  # noqa: F401
from tests.integration.test_userns_boundary import NOBODY, _userns_works

PIDS = 64
MEMORY = 256 << 20
CONTROLLERS = ("memory", "pids", "cpu")
pytestmark = [
    pytest.mark.skipif(os.geteuid() != 0, reason="root makes the runs' cgroups and the unprivileged user here"),
    pytest.mark.skipif(not Path("/proc/self/cgroup").exists(), reason="needs Linux cgroups"),
]

GATE = """
import os, sys, time
for _ in range(1200):  # at most 60 s: the test releases the payload once it has read the limits
    if os.path.exists('go'):
        break
    time.sleep(0.05)
else:
    sys.exit('never released')
"""
STORM = GATE + """
import signal
started, refused = [], 0
for _ in range(2000):  # bounded: at most 2,000 processes, each exiting within 20 s
    try:
        pid = os.fork()
    except OSError:
        refused += 1
        if refused >= 200:
            break
        time.sleep(0.001)
        continue
    if pid == 0:
        time.sleep(20)
        os._exit(0)
    started.append(pid)
print('started', len(started), 'refused', refused, flush=True)
time.sleep(3)  # the storm holds its processes while the healthy task runs
for pid in started:
    os.kill(pid, signal.SIGKILL)
for pid in started:
    os.waitpid(pid, 0)
"""
HOG = GATE + """
held = []
for step in range(64):  # bounded: at most 2 GiB, 32 MiB at a time, every page touched
    chunk = bytearray(32 << 20)
    chunk[::4096] = b'x' * len(range(0, len(chunk), 4096))
    held.append(chunk)
    print('held', (step + 1) * 32, 'MiB', flush=True)
    time.sleep(0.02)
print('allocated 2 GiB: no limit held', flush=True)
"""


def payload(code: str) -> str:
    return f"python3 - <<'PAYLOAD'\n{code}\nPAYLOAD\necho rc=$?"


def run_groups(runner_pid: int, run_id: str, parent: str | None = None) -> dict[str, Path]:
    """The run's cgroups, found from the runner's own groups (or the delegated parent) as the runner makes them."""
    groups: dict[str, Path] = {}
    for line in Path(f"/proc/{runner_pid}/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for ctrl in ctrls.split(",") if ctrls else [""]:
            if ctrl in CONTROLLERS:
                base = Path("/sys/fs/cgroup", ctrl, path.lstrip("/"), parent or "")
                groups[ctrl] = base / "amux-runs" / run_id
            elif ctrl == "" and Path("/sys/fs/cgroup/cgroup.controllers").exists():
                base = Path("/sys/fs/cgroup", path.lstrip("/"), parent or "")
                groups.update({c: base / "amux-runs" / run_id for c in CONTROLLERS})
    return groups


def workspace_pids(workspace: Path) -> list[int]:
    """The processes whose working folder is the run's workspace (the payload, its shell, the agent)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "cwd") == str(workspace):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


async def limits_in_place(ws_root: Path, task_id: str, runner_pid: int, mechanism: str,
                          parent: str | None = None) -> list[int]:
    """Wait for the payload to start, check its limits are in place, return its processes (then release it)."""
    workspace = ws_root / task_id

    async def children() -> list[int]:  # once the payload itself (`python3 -`, gated) has started
        pids = workspace_pids(workspace) if workspace.exists() else []
        return pids if any(_cmdline(p) == b"python3\0-\0" for p in pids) else []

    pids = await eventually(children, timeout=60)
    if mechanism == "cgroup":
        groups = run_groups(runner_pid, f"{task_id}.1", parent)
        assert Path(groups["pids"], "pids.max").read_text().strip() == str(PIDS), groups
        memory = groups["memory"]
        limit = (memory / "memory.max") if (memory / "memory.max").exists() else memory / "memory.limit_in_bytes"
        assert int(limit.read_text()) == MEMORY, limit
        members = set(Path(groups["pids"], "cgroup.procs").read_text().split())
        assert {str(p) for p in pids} <= members, (pids, members)  # in the group before the payload runs
        for pid in pids:
            assert "amux-runs" in Path(f"/proc/{pid}/cgroup").read_text()
    else:
        for pid in pids:
            limits = Path(f"/proc/{pid}/limits").read_text()
            assert f"Max processes             {PIDS}" in limits, limits
            assert f"Max data size             {MEMORY}" in limits, limits
    return pids


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


def release(ws_root: Path, task_id: str) -> None:
    go = ws_root / task_id / "go"
    go.write_text("go")
    os.chmod(go, 0o644)


async def storm_beside_a_healthy_task(hub, ws_root: Path, runner_pid: int, mechanism: str, isolation: str,
                                      parent: str | None = None) -> None:
    caller = await hub.hub.auth.authenticate(await hub.token("stormer"))
    limits = {"pids_max": PIDS, "memory_max": MEMORY}
    storm = await hub.hub.tasks.submit(caller, SubmitRequest(prompt=payload(STORM), profile="claude",
                                                             isolation=isolation, limits=limits, timeout_s=120))
    pids = await limits_in_place(ws_root, storm["task_id"], runner_pid, mechanism, parent)
    release(ws_root, storm["task_id"])
    peak = 0
    async with aiohttp.ClientSession() as http:
        deadline = time.monotonic() + 60
        healthy_done = False
        while time.monotonic() < deadline:
            view = await hub.hub.tasks.get(caller, storm["task_id"])
            if mechanism == "cgroup":
                members = run_groups(runner_pid, f"{storm['task_id']}.1", parent)["pids"] / "cgroup.procs"
                if members.exists():
                    peak = max(peak, len(members.read_text().split()))
            async with http.get(f"{hub.url}/healthz") as r:
                assert r.status == 200  # the hub answers throughout
            if not healthy_done:
                healthy = await hub.hub.tasks.run(caller, SubmitRequest(prompt="echo healthy", profile="claude",
                                                                        isolation=isolation))
                assert healthy["status"] == "succeeded" and "healthy" in out(healthy), healthy
                healthy_done = True
            if view["status"] not in ("queued", "running"):
                break
            await asyncio.sleep(0.1)
    view = await hub.hub.tasks.get(caller, storm["task_id"])
    text = out(view)
    assert view["status"] == "succeeded", (view["status"], view["error"], text)
    started = int(text.split("started ", 1)[1].split()[0])
    refused = int(text.split("refused ", 1)[1].split()[0])
    assert refused > 0, text  # the storm met the limit ...
    assert started < PIDS, text  # ... and never had more than pids_max processes
    assert peak <= PIDS, peak
    events = (await hub.hub.tasks.events(caller, storm["task_id"]))["events"]
    if mechanism == "cgroup":
        said = [e for e in events if e["type"] == "status" and "process limit 64 reached" in (e.get("text") or "")]
        assert len(said) == 1, events  # said once
    assert view["limits"] is not None and view["limits"]["pids_max"] == PIDS, view["limits"]

    async def gone() -> bool:  # nothing of the run outlives it
        return not any(Path(f"/proc/{p}").exists() for p in pids)

    await eventually(gone, timeout=15)


async def hog_beside_a_healthy_task(hub, ws_root: Path, runner_pid: int, isolation: str,
                                    parent: str | None = None) -> None:
    caller = await hub.hub.auth.authenticate(await hub.token("hogger"))
    hog = await hub.hub.tasks.submit(caller, SubmitRequest(prompt=payload(HOG), profile="claude", isolation=isolation,
                                                           limits={"pids_max": PIDS, "memory_max": "256MiB"},
                                                           timeout_s=120))
    await limits_in_place(ws_root, hog["task_id"], runner_pid, "cgroup", parent)
    release(ws_root, hog["task_id"])
    healthy = await hub.hub.tasks.run(caller, SubmitRequest(prompt="echo healthy", profile="claude",
                                                            isolation=isolation))
    assert healthy["status"] == "succeeded", healthy
    view = await hub.hub.tasks.wait_terminal(caller, hog["task_id"], timeout_s=90)
    assert view["status"] == "failed", (view["status"], view["error"], out(view))
    assert view["error"] is not None and "memory limit 256 MiB reached" in view["error"], view["error"]
    assert not any(Path(p).exists() for p in run_groups(runner_pid, f"{hog['task_id']}.1", parent).values())


@pytest.fixture
def shared_dir():
    folder = Path(tempfile.mkdtemp(prefix="amux-limits-"))
    folder.chmod(0o755)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


needs_bwrap = pytest.mark.skipif(BWRAP is None, reason="bubblewrap is not installed (make test installs it)")


@needs_bwrap
async def test_a_linux_dac_fork_storm_stops_at_pids_max_beside_a_healthy_task_and_the_hub_answers(dac_hub, tmp_path):
    async with runner_process(dac_hub, tmp_path, "storm-dac", "--isolation", "linux-dac") as caps:
        assert caps["limits"]["mechanism"]["pids"].startswith("cgroup"), caps["limits"]
        await storm_beside_a_healthy_task(dac_hub, tmp_path / "storm-dac-ws", caps["runner_pid"], "cgroup",
                                          "linux-dac")


@needs_bwrap
async def test_a_linux_dac_memory_hog_is_killed_whole_and_fails_naming_the_limit_beside_a_healthy_task(
        dac_hub, tmp_path):
    async with runner_process(dac_hub, tmp_path, "hog-dac", "--isolation", "linux-dac") as caps:
        await hog_beside_a_healthy_task(dac_hub, tmp_path / "hog-dac-ws", caps["runner_pid"], "linux-dac")


async def test_a_process_mode_fork_storm_and_memory_hog_are_held_by_the_runs_cgroup(dac_hub, tmp_path):
    dac_hub.hub.settings.execution.allow_process_on_hub = True  # a root process-mode runner beside the hub
    async with runner_process(dac_hub, tmp_path, "storm-proc", "--dedicated", "--isolation", "process") as caps:
        await storm_beside_a_healthy_task(dac_hub, tmp_path / "storm-proc-ws", caps["runner_pid"], "cgroup",
                                          "process")
        await hog_beside_a_healthy_task(dac_hub, tmp_path / "storm-proc-ws", caps["runner_pid"], "process")


def own_groups() -> dict[str, Path]:
    """This process's own v1 group in each controller (the runner started from here inherits them)."""
    groups = {}
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, ctrls, path = line.split(":", 2)
        for ctrl in ctrls.split(","):
            if ctrl in CONTROLLERS:
                groups[ctrl] = Path("/sys/fs/cgroup", ctrl, path.lstrip("/"))
    return groups


def delegate(name: str) -> str:
    """Root makes a group under this process's own in each controller and gives it to `nobody` (as an operator
    does for a runner that is not root); the runner names it relative to its own group."""
    for own in own_groups().values():
        group = own / name
        group.mkdir(exist_ok=True)
        for entry in (group, *group.iterdir()):
            os.chown(entry, NOBODY, NOBODY)
    return name


def undelegate(name: str) -> None:
    for own in own_groups().values():
        group = own / name
        for child in sorted((p for p in group.rglob("*") if p.is_dir()), reverse=True) if group.exists() else []:
            child.rmdir()
        if group.exists():
            group.rmdir()


userns_here = pytest.mark.skipif(BWRAP is None or not _userns_works(),
                                 reason="unprivileged user namespaces are unavailable on this machine")
v1_here = pytest.mark.skipif(not Path("/sys/fs/cgroup/pids/pids.max").parent.is_dir()
                             or Path("/sys/fs/cgroup/cgroup.controllers").exists(),
                             reason="the delegated-group test makes cgroup v1 groups (this machine runs v2)")


@userns_here
@v1_here
async def test_a_userns_runner_with_a_delegated_cgroup_holds_a_storm_and_a_hog_like_root(dac_hub, shared_dir):
    parent = delegate(f"amux-test-deleg-{os.getpid()}")
    try:
        async with runner_process(dac_hub, shared_dir, "deleg", "--cgroup-parent", parent, uid=NOBODY) as caps:
            assert caps["isolation"] == ["userns"], caps
            assert caps["limits"]["mechanism"]["memory"] == "cgroup-v1", caps["limits"]
            await storm_beside_a_healthy_task(dac_hub, shared_dir / "deleg-ws", caps["runner_pid"], "cgroup",
                                              "userns", parent)
            await hog_beside_a_healthy_task(dac_hub, shared_dir / "deleg-ws", caps["runner_pid"], "userns", parent)
    finally:
        undelegate(parent)


@userns_here
async def test_a_userns_runner_without_a_cgroup_bounds_each_child_by_rlimits(dac_hub, shared_dir):
    async with runner_process(dac_hub, shared_dir, "rlim", uid=NOBODY) as caps:
        assert caps["limits"]["mechanism"]["pids"].startswith("rlimit-nproc"), caps["limits"]
        await storm_beside_a_healthy_task(dac_hub, shared_dir / "rlim-ws", caps["runner_pid"], "rlimit", "userns")


def test_a_profile_or_request_cannot_raise_a_limit_past_the_runners():
    runtime = {"limits": {"memory_max": MEMORY, "pids_max": PIDS, "cpu_max": 1.0, "mechanism": {"pids": "cgroup-v1"}}}
    asked = {"isolation": "linux-dac", "limits": {"memory_max": 8 << 30, "pids_max": 100_000, "cpu_max": 64.0}}
    assert applied_limits(asked, runtime) == {"memory_max": MEMORY, "pids_max": PIDS, "cpu_max": 1.0,
                                              "mechanism": {"pids": "cgroup-v1"}}
    lower = {"isolation": "userns", "limits": {"pids_max": 8}}
    assert applied_limits(lower, runtime)["pids_max"] == 8  # lowering is what a request may do
