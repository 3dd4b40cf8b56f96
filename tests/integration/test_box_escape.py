"""The escape suite: a box is a sandbox. Real bubblewrap boxes on this machine, driven through the official MCP client.

Each test is one way out a box's commands might try; each must fail while the hub keeps serving.
"""
from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, AsyncIterator

import httpx2
import pytest
import sqlalchemy as sa
from aiohttp import web

from hub.app import Hub
from hub.boxes.base import BoxError
from hub.boxes.local import LocalBoxDriver
from hub.boxes.uids import UID_BASE, UID_SPAN, UidClaims
from hub.clock import ManualClock
from hub.config import BoxSettings, LeaseSettings
from hub.store.db import Database
from hub.store.tables import boxes
from tests.helpers import REPO, hub_settings, mcp_client, started

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None,
                                reason="install bubblewrap (make test does: apt-get install -y bubblewrap)")


async def destroy_live_boxes(hub: Hub) -> None:
    """Destroy every box a test left (boxes outlive their hub by design, so a test hub stopping keeps them)."""
    async with hub.db.read() as conn:
        rows = (await conn.execute(sa.select(boxes.c.id, boxes.c.handle)
                                   .where(boxes.c.state.in_(("creating", "live"))))).all()
    for row in rows:
        with contextlib.suppress(Exception):
            await hub.leases.driver.destroy(row.handle or hub.leases.driver.provisional(row.id))


@contextlib.asynccontextmanager
async def box_hub(db_url: str, home: Path, keep_boxes: bool = False, leases: dict[str, Any] | None = None,
                  **box_settings: Any) -> AsyncIterator[dict[str, Any]]:
    """Serve a hub whose boxes use `box_settings` (and its leases `leases`); yield its url, port, home, admin token
    and Hub.

    Its boxes are destroyed when it stops, unless `keep_boxes` (a hub restart keeps them).
    """
    settings = hub_settings(db_url, home)
    settings.boxes = BoxSettings(**box_settings)
    settings.leases = LeaseSettings(**(leases or {}))
    hub = Hub(settings, Database(db_url), ManualClock())
    runner = web.AppRunner(hub.web_app(background=False), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # noqa: SLF001
    admin = await hub.auth.create_token("admin", label="cli", admin=True)
    home.mkdir(parents=True, exist_ok=True)
    (home / "admin.token").write_text(admin + "\n")  # what `amux up` writes: the prize a box must not reach
    try:
        yield {"url": f"http://127.0.0.1:{port}", "port": port, "home": home.resolve(), "admin": admin, "hub": hub}
    finally:
        if not keep_boxes:
            await destroy_live_boxes(hub)
        await runner.cleanup()
        await hub.db.close()


@contextlib.asynccontextmanager
async def agent(h: dict[str, Any], user: str = "alice") -> AsyncIterator[Any]:
    """Connect an MCP client for `user` holding a fresh lease task; yield a helper with its handle."""
    token = await h["hub"].auth.create_token(user)
    async with mcp_client(h["url"], token, name="Claude") as client:
        res = await client.call_tool("rift_task_new", {"name": "escape"})
        assert not res.is_error, res.content[0].text
        yield Agent(client, res.structured_content["handle"])


class Agent:
    """One agent holding one task: make boxes and run commands in them."""

    def __init__(self, client: Any, handle: str) -> None:
        self.client, self.handle = client, handle

    async def call(self, tool: str, **args: Any) -> dict[str, Any]:
        res = await self.client.call_tool(tool, {"task": self.handle, **args})
        assert not res.is_error, f"{tool}: {res.content[0].text}"
        return res.structured_content

    async def refused(self, tool: str, **args: Any) -> str:
        res = await self.client.call_tool(tool, {"task": self.handle, **args})
        assert res.is_error, f"{tool} was not refused: {res.structured_content}"
        return res.content[0].text

    async def box(self) -> str:
        return (await self.call("rift_vm_new"))["vm_id"]

    async def run(self, vm_id: str, command: str, timeout_s: float = 30) -> dict[str, Any]:
        return await self.call("rift_vm_exec", vm_id=vm_id, command=command, timeout_s=timeout_s)


@pytest.fixture
async def h(sqlite_url: str, tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    async with box_hub(sqlite_url, tmp_path / "home") as served:
        yield served


async def handle_of(h: dict[str, Any], vm_id: str) -> dict[str, Any]:
    async with h["hub"].db.read() as conn:
        return (await conn.execute(sa.select(boxes.c.handle).where(boxes.c.id == vm_id))).scalar_one()


async def set_handle(h: dict[str, Any], vm_id: str, handle: dict[str, Any]) -> None:
    async with h["hub"].db.write() as conn:
        await conn.execute(boxes.update().where(boxes.c.id == vm_id).values(handle=handle))


def pids_in_box(init_pid: int, ns: str | None = None) -> list[int]:
    """Return the live host pids in a box's PID namespace (by the namespace link of its init, or `ns`)."""
    if ns is None:
        try:
            ns = os.readlink(f"/proc/{init_pid}/ns/pid")
        except OSError:
            return []
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry.name}/ns/pid") == ns and _state(int(entry.name)) not in ("Z", "X"):
                    found.append(int(entry.name))
    return found


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "X"


async def healthz_p99(url: str, stop: asyncio.Event) -> float:
    """Probe /healthz until `stop`; return the p99 latency in seconds (every probe must answer 200)."""
    samples = []
    async with httpx2.AsyncClient(timeout=10) as http:
        while not stop.is_set():
            t = time.monotonic()
            r = await http.get(f"{url}/healthz")
            assert r.status_code == 200
            samples.append(time.monotonic() - t)
            await asyncio.sleep(0.02)
    samples.sort()
    return samples[min(len(samples) - 1, int(len(samples) * 0.99))]


# --- the hub's process -------------------------------------------------------------------------------

async def test_a_box_can_neither_see_nor_signal_the_hubs_process(h):
    hub_pid = os.getpid()
    async with agent(h) as a:
        vm = await a.box()
        r = await a.run(vm, f"ls /proc | grep -x {hub_pid}; kill -0 {hub_pid} && echo SEEN; "
                            f"kill -9 {hub_pid} && echo KILLED; ls /proc | grep -E '^[0-9]+$' | sort -n | tail -1")
        assert "SEEN" not in r["stdout"] and "KILLED" not in r["stdout"]
        assert int(r["stdout"].split()[-1]) < 100  # the box sees only its own few processes
    async with httpx2.AsyncClient() as http:
        assert (await http.get(f"{h['url']}/healthz")).status_code == 200


async def test_a_box_cannot_read_the_hubs_environment(h):
    os.environ.setdefault("AMUX_ESCAPE_CANARY", "canary-7731")
    async with agent(h) as a:
        vm = await a.box()
        r = await a.run(vm, f"cat /proc/{os.getpid()}/environ; cat /proc/1/environ; "
                            "for f in /proc/[0-9]*/environ; do cat $f; done; env")
    assert "canary-7731" not in r["stdout"] + r["stderr"]
    assert "AMUX_TEST_DATABASE_URL" not in r["stdout"] and str(h["home"]) not in r["stdout"]


async def test_a_box_runs_as_an_unprivileged_uid_outside_though_root_inside(h):
    async with agent(h) as a:
        vm = await a.box()
        r = await a.run(vm, "id -u; sleep 300 >/dev/null 2>&1 &")
        assert r["stdout"].split()[0] == "0"
        init = (await handle_of(h, vm))["init_pid"]
        uids = {Path(f"/proc/{p}/status").read_text().split("Uid:")[1].split()[0] for p in pids_in_box(init)}
        assert uids and "0" not in uids


# --- other boxes -------------------------------------------------------------------------------------

async def test_a_box_cannot_list_another_boxs_processes(h):
    async with agent(h) as a, agent(h, "bob") as b:
        mine, theirs = await a.box(), await b.box()
        await a.run(mine, "sleep 6123 >/dev/null 2>&1 &")
        r = await b.run(theirs, "cat /proc/[0-9]*/cmdline | tr '\\0' ' '; ps ax")
        assert "6123" not in r["stdout"]
        r = await a.run(mine, "ps ax")
        assert "sleep 6123" in r["stdout"]  # it is there, in its own box


async def test_a_box_cannot_read_or_write_another_boxs_files(h):
    async with agent(h) as a, agent(h, "bob") as b:
        mine, theirs = await a.box(), await b.box()
        await a.run(mine,
                    "echo alice-secret > /box/secret.txt; echo tmp-secret > /tmp/t.txt; sleep 600 >/dev/null 2>&1 &")
        host_dir = h["home"] / "boxes" / mine
        r = await b.run(theirs, f"cat /box/secret.txt /tmp/t.txt; cat /proc/[0-9]*/root/box/secret.txt; "
                                f"ls -A {host_dir}; cat {host_dir}/*; "
                                f"echo evil > {host_dir}/secret.txt; echo evil > /proc/1/root/box/secret.txt; "
                                f"grep -rs alice-secret / --exclude-dir=proc --exclude-dir=sys 2>/dev/null | head -1")
        assert "alice-secret" not in r["stdout"] and "tmp-secret" not in r["stdout"]
        assert (await a.run(mine, "cat /box/secret.txt"))["stdout"] == "alice-secret\n"


# --- the hub's files and port ------------------------------------------------------------------------

async def test_a_box_cannot_read_the_admin_token(h):
    async with agent(h) as a:
        vm = await a.box()
        home = h["home"]
        r = await a.run(vm, f"cat {home}/admin.token; ls -A {home}; cat {home}/amux.db | head -c 100; "
                            f"find / -name admin.token -not -path '/proc/*' 2>/dev/null")
    assert h["admin"] not in r["stdout"] and "admin.token" not in r["stdout"]


async def test_with_network_none_a_box_cannot_reach_the_hubs_port(h):
    async with agent(h) as a:
        vm = await a.box()
        r = await a.run(vm, f"bash -c 'exec 3<>/dev/tcp/127.0.0.1/{h['port']} && echo CONNECTED'; "
                            f"python3 -c \"import urllib.request; urllib.request.urlopen('{h['url']}/healthz', "
                            "timeout=3); "
                            f"print('CONNECTED')\"; cat /proc/net/dev | tail -n +3 | cut -d: -f1")
    assert "CONNECTED" not in r["stdout"]
    assert r["stdout"].split() == ["lo"]  # loopback of its own, nothing else


async def test_with_network_host_a_box_shares_the_hosts_network(sqlite_url, tmp_path):
    async with box_hub(sqlite_url, tmp_path / "home", network="host") as hh, agent(hh) as a:
        vm = await a.box()
        r = await a.run(vm, f"bash -c 'exec 3<>/dev/tcp/127.0.0.1/{hh['port']} && echo CONNECTED'")
        assert "CONNECTED" in r["stdout"]
        # The host's network, not its files or processes.
        r = await a.run(vm, f"cat {hh['home']}/admin.token; kill -0 {os.getpid()} && echo SEEN")
        assert hh["admin"] not in r["stdout"] and "SEEN" not in r["stdout"]


async def test_a_box_cannot_write_outside_its_own_filesystem(h):
    async with agent(h) as a:
        vm = await a.box()
        targets = ["/usr/escape", "/etc/escape", "/escape", "/opt/escape", f"{h['home']}/escape", "/var/escape",
                   "/root/escape", "/home/escape", "/proc/sys/kernel/hostname", "/sys/escape"]
        r = await a.run(vm, "; ".join(f"(echo x > {t}) 2>/dev/null && echo WROTE {t}" for t in targets)
                        + "; echo ok > /box/f && echo ok > /tmp/f && echo OWN")
        assert "WROTE" not in r["stdout"] and "OWN" in r["stdout"]
    assert not any(Path(t).exists() for t in targets[:6])


# --- destruction -------------------------------------------------------------------------------------

async def test_no_process_of_a_box_outlives_rift_vm_destroy(h):
    async with agent(h) as a:
        vm = await a.box()
        await a.run(vm, "sleep 6001 >/dev/null 2>&1 & setsid sh -c 'sleep 6002 >/dev/null 2>&1 &' </dev/null; "
                        "nohup sh -c 'trap \"\" TERM HUP INT; while :; do sleep 1; done' >/dev/null 2>&1 & "
                        "(sh -c 'sleep 6003 >/dev/null 2>&1 &' &) ; echo written > /box/data")
        handle = await handle_of(h, vm)
        ns = os.readlink(f"/proc/{handle['init_pid']}/ns/pid")
        before = pids_in_box(handle["init_pid"])
        assert len(before) >= 5
        await a.call("rift_vm_destroy", vm_id=vm)
        deadline = time.monotonic() + 5
        while pids_in_box(0, ns) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        assert pids_in_box(0, ns) == []
        assert not (h["home"] / "boxes" / vm).exists()
        assert not any(Path(p).exists() for p in (handle.get("cgroups") or {}).values())


async def test_a_box_and_its_background_processes_survive_a_hub_restart(sqlite_url, tmp_path):
    home = tmp_path / "home"
    async with box_hub(sqlite_url, home, keep_boxes=True) as first:
        token = await first["hub"].auth.create_token("alice")
        async with mcp_client(first["url"], token, name="Claude") as client:
            task = (await client.call_tool("rift_task_new", {"name": "long"})).structured_content
            vm = (await client.call_tool("rift_vm_new", {"task": task["handle"]})).structured_content["vm_id"]
            r = await client.call_tool("rift_vm_exec", {"task": task["handle"], "vm_id": vm,
                                                        "command": "sleep 6100 >/dev/null 2>&1 & echo $!; echo "
                                                                   "kept > /box/f"})
            pid = r.structured_content["stdout"].strip()
    async with box_hub(sqlite_url, home) as second:  # a new hub process: the driver rebuilds from the handle
        async with mcp_client(second["url"], token, name="Claude") as client:
            r = await client.call_tool("rift_vm_exec", {"task": task["handle"], "vm_id": vm,
                                                        "command": f"cat /proc/{pid}/cmdline | tr '\\0' ' "
                                                                   "'; cat /box/f"})
            assert not r.is_error and r.structured_content["stdout"] == "sleep 6100 kept\n"
            closed = await client.call_tool("rift_task_close", {"task": task["handle"]})
            assert closed.structured_content["destroyed"] == [vm]


# --- bad input: limits hold and the hub stays responsive -------------------------------------------------

@pytest.fixture
async def tight(sqlite_url: str, tmp_path: Path) -> AsyncIterator[dict[str, Any]]:
    async with box_hub(sqlite_url, tmp_path / "home", pids_max=64, memory_mb=96, disk_mb=16, cpus=0.5) as served:
        yield served


async def _under_load(h: dict[str, Any], command: str, timeout_s: float = 8) -> tuple[dict[str, Any], float, Agent]:
    stop = asyncio.Event()
    probe = asyncio.create_task(healthz_p99(h["url"], stop))
    async with agent(h) as a:
        vm = await a.box()
        try:
            r = await a.run(vm, command, timeout_s=timeout_s)
            # The box itself is still usable: at once after a timeout (its processes are killed and reaped), and
            # once what a finished command left running has burnt out (a fork bomb under the process limit does).
            deadline = time.monotonic() + 5
            after = await a.run(vm, "echo alive")
            while after["stdout"] != "alive\n" and not r["timed_out"] and time.monotonic() < deadline:
                after = await a.run(vm, "echo alive")
        finally:
            stop.set()
        p99 = await probe
        assert after["stdout"] == "alive\n", (r, after)
        await a.call("rift_vm_destroy", vm_id=vm)
    return r, p99, a


async def test_a_fork_bomb_hits_the_process_limit_and_the_hub_stays_responsive(tight):
    # Only shell builtins after the bomb (a `sleep` might not fork): count the box's processes.
    r, p99, _ = await _under_load(tight, "bomb() { bomb | bomb & }; bomb; i=0; while [ $i -lt 100000 ]; do "
                                         "i=$((i+1)); done; set -- /proc/[0-9]*; echo $#; wait", timeout_s=6)
    assert p99 < 1.0, f"/healthz p99 {p99:.3f}s under a fork bomb"
    if r["stdout"].strip():
        assert int(r["stdout"].split()[-1]) <= 64


async def test_filling_the_disk_hits_the_box_size_and_the_hub_stays_responsive(tight):
    r, p99, _ = await _under_load(tight, "dd if=/dev/zero of=/box/fill bs=1M count=200 2>&1; ls -l /box/fill | awk "
                                         "'{print $5}'")
    assert "No space left on device" in r["stdout"] and int(r["stdout"].split()[-1]) <= 16 * 1024 * 1024
    assert p99 < 1.0, f"/healthz p99 {p99:.3f}s while a box filled its disk"


async def test_a_memory_hog_hits_the_memory_limit_and_the_hub_stays_responsive(tight):
    r, p99, _ = await _under_load(tight, "head -c 1000000000 /dev/zero | tail -c 900000000 | wc -c; echo rc=$?")
    assert "900000000" not in r["stdout"]  # it never got the memory it asked for
    assert p99 < 1.0, f"/healthz p99 {p99:.3f}s while a box allocated without limit"


# --- the driver fails closed -------------------------------------------------------------------------------

def _without(*keys: str) -> Any:
    return lambda handle: {k: v for k, v in handle.items() if k not in keys}


@pytest.mark.parametrize("damage", [
    pytest.param(_without("sandbox"), id="no-sandbox-key"),
    pytest.param(_without("init_pid", "init_start"), id="bwrap-without-its-init"),
    pytest.param(lambda handle: {**handle, "sandbox": "podman"}, id="an-unknown-sandbox"),
    pytest.param(lambda handle: {k: handle[k] for k in ("box_id", "host", "dir")}, id="the-provisional-handle"),
])
async def test_a_box_whose_handle_lacks_its_sandbox_record_runs_nothing_on_the_host(h, tmp_path, damage):
    marker = tmp_path / "ran-on-the-host"
    async with agent(h) as a:
        vm = await a.box()
        good = await handle_of(h, vm)
        await set_handle(h, vm, damage(good))
        try:
            text = await a.refused("rift_vm_exec", vm_id=vm, command=f"touch {marker}; echo RAN")
        finally:
            await set_handle(h, vm, good)  # so the box is destroyed through its real handle
    assert "no sandbox record" in text and "`rift_vm_destroy` it" in text and "`rift_vm_new`" in text, text
    assert not marker.exists()


# --- every tmpfs has a size ------------------------------------------------------------------------------

async def test_dev_and_dev_shm_in_a_box_are_small_and_writing_past_them_fails(sqlite_url, tmp_path):
    async with box_hub(sqlite_url, tmp_path / "home", shm_mb=4, disk_mb=8) as hh, agent(hh) as a:
        vm = await a.box()
        r = await a.run(vm, "df -k /dev /dev/shm /tmp /box | tail -n +2 | awk '{print $6, $2}'")
        assert dict(line.split() for line in r["stdout"].splitlines()) == {
            "/dev": "64", "/dev/shm": "4096", "/tmp": "8192", "/box": "8192"}
        r = await a.run(vm, "dd if=/dev/zero of=/dev/shm/fill bs=1M count=64 2>&1; stat -c %s /dev/shm/fill")
        assert "No space left on device" in r["stdout"] and int(r["stdout"].split()[-1]) <= 4 << 20
        r = await a.run(vm, "echo x > /dev/fill")
        assert r["exit_code"] != 0 and "Read-only file system" in r["stderr"]
        r = await a.run(vm, "echo x > /dev/null && head -c 8 /dev/urandom | wc -c && ls /dev")
        assert r["stdout"].split() == ["8", "fd", "full", "null", "random", "shm", "stderr", "stdin", "stdout", "tty",
                                       "urandom", "zero"]


# --- uids ---------------------------------------------------------------------------------------------------

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="a box gets a host uid of its own only under a root hub")


@root_only
async def test_live_boxes_never_share_a_host_uid(sqlite_url, tmp_path):
    async with box_hub(sqlite_url, tmp_path / "home", max_live_per_principal=0) as hh, agent(hh) as a:
        vms = await asyncio.gather(*(a.box() for _ in range(12)))
        handles = [await handle_of(hh, vm) for vm in vms]
        uids = [hd["uid"] for hd in handles]
        assert len(set(uids)) == 12 and all(UID_BASE <= u < UID_BASE + UID_SPAN for u in uids)
        for hd in handles:  # outside, every process of a box runs as that box's uid
            owners = {Path(f"/proc/{p}/status").read_text().split("Uid:")[1].split()[0]
                      for p in pids_in_box(hd["init_pid"])}
            assert owners == {str(hd["uid"])}


@root_only
async def test_a_destroyed_boxs_uid_is_free_for_the_next_box_and_none_is_shared_meanwhile(tmp_path):
    claims = UidClaims(tmp_path / "uids", base=300_000, span=2)  # a range of two, so the third box must wait
    driver = LocalBoxDriver(tmp_path / "boxes", BoxSettings(), hide=[tmp_path], uids=claims)
    made = list(await asyncio.gather(driver.create("vm_uida"), driver.create("vm_uidb")))
    try:
        assert sorted(hd["uid"] for hd in made) == [300_000, 300_001]
        with pytest.raises(BoxError) as refused:
            await driver.create("vm_uidc")
        assert "rift_vm_destroy" in str(refused.value) and not (tmp_path / "boxes" / "vm_uidc").exists()
        await driver.destroy(made[0])
        made.append(await driver.create("vm_uidc"))
        assert made[-1]["uid"] == made[0]["uid"] and claims.held() == {made[0]["uid"]: "vm_uidc",
                                                                       made[1]["uid"]: "vm_uidb"}
        assert (await driver.exec(made[-1], "echo hi", 10)).stdout == "hi\n"
    finally:
        for hd in made:
            await driver.destroy(hd)
    assert claims.held() == {}


# --- a hub that is not root ---------------------------------------------------------------------------------

NOBODY = 65534


@root_only
async def test_a_hub_that_is_not_root_runs_commands_in_its_boxes_which_still_cannot_see_the_hosts_files():
    base = Path(tempfile.mkdtemp(prefix="amux-nonroot-", dir="/tmp"))  # outside root's 0700 pytest directories
    home = base / "home"
    home.mkdir()
    canary = base / "host-file.txt"
    canary.write_text("host-canary-5521\n")
    for p in (base, home, canary):
        os.chown(p, NOBODY, NOBODY)
    base.chmod(0o755)
    canary.chmod(0o644)  # readable by the hub's user, so only the sandbox keeps it from a box
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "AMUX_HOME": str(home),
           "PYTHONPATH": str(REPO), "LANG": "C.UTF-8"}
    with open(base / "hub.log", "wb") as log:
        proc = await asyncio.create_subprocess_exec(
            "setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--",
            sys.executable, "-m", "hub.cli", "up", "--listen", "127.0.0.1:0", "--slots", "1",
            cwd=REPO, env=env, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log)
    try:
        async def served() -> dict[str, Any] | None:
            if proc.returncode is not None:
                raise AssertionError((base / "hub.log").read_text()[-2000:])
            with contextlib.suppress(OSError, ValueError):
                if (home / "admin.token").exists():
                    return json.loads((home / "hub.json").read_text())
            return None
        url = (await started(served, "amux up as nobody", proc=proc))["url"]
        admin = (home / "admin.token").read_text().strip()
        async with mcp_client(url, admin, name="Claude") as client:
            task = await client.call_tool("rift_task_new", {"name": "not root"})
            handle = task.structured_content["handle"]
            a = Agent(client, handle)
            vm = await a.box()
            assert (await a.run(vm, "echo hi"))["stdout"] == "hi\n"
            r = await a.run(vm, f"id -u; cat {canary}; ls -A {base} {home}; cat {home}/admin.token; "
                                f"ls /proc | grep -E '^[0-9]+$' | sort -n | tail -1")
            out = r["stdout"] + r["stderr"]
            assert r["stdout"].split()[0] == "0" and int(r["stdout"].split()[-1]) < 100
            assert "host-canary-5521" not in out and admin not in out and "hub.log" not in out
            await a.call("rift_task_close")
    finally:
        proc.terminate()
        await proc.wait()
        kill_boxes_of(home / "amux.db")  # boxes outlive their hub: a failed test must not leave them running
        shutil.rmtree(base, ignore_errors=True)


def kill_boxes_of(db_path: Path) -> None:
    """Kill the init of every box a stopped hub's SQLite database still holds live."""
    import sqlite3

    with contextlib.suppress(sqlite3.Error), contextlib.closing(sqlite3.connect(db_path)) as conn:
        for (raw,) in conn.execute("select handle from boxes where state in ('creating', 'live')"):
            handle = json.loads(raw or "{}")
            pid = handle.get("init_pid")
            with contextlib.suppress(OSError, ValueError, IndexError):  # only that very process, never a reused pid
                if int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]) == handle.get("init_start"):
                    os.kill(pid, 9)
