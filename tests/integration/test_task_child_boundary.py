"""The escape suite: a task child is hostile code. A stand-in agent CLI (tests/fakes/bin/shell-agent) runs its prompt
as a shell command, as Claude's Bash tool does under policy-allow, on a real `amux runner` process; each attempt to
reach the hub, its secrets, its database or another principal fails, and ordinary work still succeeds.
"""
from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any, AsyncIterator

import pytest
import sqlalchemy as sa

from hub.domain.isolation import NO_BWRAP, ROOT_HAS_DAC
from hub.errors import Invalid
from hub.services.tasks.service import SubmitRequest
from hub.store.tables import runtimes
from tests.helpers import REPO, eventually, start_hub, started

SHELL_AGENT = REPO / "tests" / "fakes" / "bin" / "shell-agent"
BWRAP = shutil.which("bwrap")
pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="linux-dac is Linux's"),
    pytest.mark.skipif(os.geteuid() != 0, reason="the runner switches uids as root; the suite runs as root in CI"),
    pytest.mark.skipif(BWRAP is None, reason="bubblewrap is not installed (make test installs it)"),
]
SECRET = "sentinel-admin-token-value"


# A child's ordinary work, one answer a line: its workspace (work), its uid, its folder, python3 (42), /usr, the
# hub's /healthz (200) and its run token's principal over the bridged hub port.
ORDINARY_WORK = ("echo work > out.txt && cat out.txt && id -u && pwd && "
                 "python3 -c 'print(6 * 7)' && ls /usr/bin | grep -c . && "
                 "python3 -c \"import os, urllib.request; print(urllib.request.urlopen("
                 "os.environ['AMUX_HUB_URL'] + '/healthz').status)\" && "
                 "python3 -c \"import json, os, urllib.request; print(json.load(urllib.request.urlopen("
                 "urllib.request.Request(os.environ['AMUX_HUB_URL'] + '/api/v1/whoami', headers={"
                 "'Authorization': 'Bearer ' + os.environ['AMUX_TOKEN']})))['principal'])\"")


async def caps_of(hub, name: str) -> dict | None:
    async with hub.db.read() as conn:
        row = (await conn.execute(sa.select(runtimes.c.status, runtimes.c.capabilities)
                                  .where(runtimes.c.name == name))).first()
    return dict(row.capabilities) if row is not None and row.status == "online" else None


@contextlib.asynccontextmanager
async def runner_process(hub, tmp: Path, name: str, *flags: str, uid: int | None = None,
                         path: str | None = None, claude: Path = SHELL_AGENT) -> AsyncIterator[dict]:
    """A real `amux runner` subprocess with the stand-in agent as its `claude`; yields its capabilities (and its
    pid, as `runner_pid`)."""
    token = await hub.hub.auth.create_token(f"ops-{name}", admin=True, runner=True)
    ws = tmp / f"{name}-ws"
    env = {**os.environ, "AMUX_TOKEN": token, "AMUX_CLAUDE_BIN": str(claude),
           "HOME": str(tmp / f"{name}-home")}
    if path is not None:
        env["PATH"] = path
    preexec = None
    if uid is not None:
        for folder in (ws, ws.parent / f"{ws.name}-homes", Path(env["HOME"])):
            folder.mkdir(parents=True, exist_ok=True)
            os.chown(folder, uid, uid)

        def preexec() -> None:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
    python = sys.executable
    if uid is not None:  # the venv's interpreter may live in root's home: the system's, with the venv's packages
        python = "/usr/bin/python3"
        site = next(Path(sys.prefix, "lib").glob("python3*/site-packages"))
        env["PYTHONPATH"] = f"{REPO}:{site}"
    argv = [python, "-m", "hub.cli", "runner", "--hub", hub.url, "--name", name, "--slots", "2",
            "--workspace-root", str(ws), *flags]
    log = open(tmp / f"{name}.log", "wb")  # noqa: SIM115 - kept for the assertion messages
    proc = await asyncio.create_subprocess_exec(*argv, cwd=REPO, env=env, stdout=log, stderr=log, preexec_fn=preexec)
    try:
        caps = await started(lambda: caps_of(hub.hub, name), f"runner {name}", proc=proc)
        yield {**caps, "runner_pid": proc.pid}
    finally:
        proc.terminate()
        await proc.wait()
        log.close()


async def run_as(hub, principal: str, prompt: str, **choices: Any) -> dict:
    token = await hub.token(principal)
    caller = await hub.hub.auth.authenticate(token)
    sub = await hub.hub.tasks.submit(caller, SubmitRequest(prompt=prompt, profile="claude", **choices))
    return await hub.hub.tasks.wait_terminal(caller, sub["task_id"], timeout_s=60)


def out(view: dict) -> str:
    return (view.get("result") or {}).get("text") or view.get("error") or ""


@pytest.fixture
async def dac_hub(sqlite_url: str, tmp_path: Path, clock):
    """A hub whose home holds the secrets an agent would go for."""
    home = tmp_path / "hubhome"
    handle = await start_hub(sqlite_url, home, clock)
    handle.hub.settings.execution.allow_process_on_hub = False  # production's rule, not the suite's default
    for name in ("admin.token", "secret.key", "runner.token"):
        (home / name).write_text(SECRET)
        (home / name).chmod(0o600)
    yield handle
    await handle.stop()


async def test_a_linux_dac_child_reaches_neither_the_hub_its_secrets_its_database_nor_its_processes(
        dac_hub, tmp_path, pg_url):
    hub = dac_hub
    home = Path(hub.hub.settings.home)
    db_file = hub.hub.db.url.split("///", 1)[-1]
    me = os.getpid()  # the hub's process: this test's
    other = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)  # a service on the runner's loopback
    other_port = other.sockets[0].getsockname()[1]
    async with runner_process(hub, tmp_path, "dac", "--isolation", "linux-dac") as caps:
        assert caps["isolation"] == ["linux-dac"], caps
        attempts = {
            "admin.token": f"cat {home}/admin.token",
            "secret.key": f"cat {home}/secret.key",
            "hub home": f"ls {home}",
            "database file": f"cat {db_file} > /dev/null",
            "hub environ": f"cat /proc/{me}/environ",
            "signal hub": f"kill -0 {me}",
            "postgres as the hub": "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 5432), 3)\"",
            "another loopback service": f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', "
                                        f"{other_port}), 3)\"",
            "the egress proxy to loopback": f"python3 -c \"import os, urllib.request; urllib.request.urlopen("
                                            f"'https://127.0.0.1:{other_port}/', timeout=5)\"",
            "write the system": "touch /usr/escaped",
            "write the hub home": f"touch {home}/escaped",
            "enter the host's namespaces": "nsenter -t 1 -m -p true",
            "host root's files": "ls -A /root | grep -v -x .pyenv",
        }
        for what, command in attempts.items():
            view = await run_as(hub, "mallory", f"{command}; echo rc=$?")
            text = out(view)
            assert view["status"] == "succeeded", (what, view.get("error"), text)
            assert SECRET not in text, (what, text)
            assert "rc=0" not in text, (what, text)
        assert not (home / "escaped").exists() and not Path("/usr/escaped").exists()
        # The same child still does ordinary work: its workspace, python3, /usr, the hub's MCP endpoint.
        view = await run_as(hub, "mallory", ORDINARY_WORK)
        text = out(view)
        assert view["status"] == "succeeded", view
        lines = text.splitlines()
        assert lines[0] == "work" and lines[3] == "42" and lines[5] == "200", text
        assert lines[6] == "mallory", text  # the run token the hub minted works through the bridged hub port
        uid = int(lines[1])
        base = hub.hub.settings.execution.uid_base
        assert uid != 0 and base <= uid < base + hub.hub.settings.execution.uid_count
        assert (Path(lines[2]) / "out.txt").stat().st_uid == uid  # written as the principal's uid
        assert view["changed_files"]["created"] == ["out.txt"]


async def test_linux_dac_principals_have_their_own_uid_workspace_and_persistent_home_and_cannot_reach_each_other(
        dac_hub, tmp_path):
    hub = dac_hub
    async with runner_process(hub, tmp_path, "dac2", "--isolation", "linux-dac"):
        alice = await run_as(hub, "alice", "echo alice-secret > mine.txt && echo kept > $HOME/notes && "
                                           "id -u && pwd && echo $HOME")
        assert alice["status"] == "succeeded", alice
        a_uid, a_ws, a_home = out(alice).splitlines()[:3]
        again = await run_as(hub, "alice", "cat $HOME/notes && id -u")
        assert out(again).splitlines()[:2] == ["kept", a_uid]  # the home persists, the uid is the principal's
        bob = await run_as(hub, "bob", f"id -u; cat {a_ws}/mine.txt; echo rc=$?; cat {a_home}/notes; echo rc=$?; "
                                       f"ls {Path(a_ws).parent}; echo rc=$?")
        text = out(bob)
        assert bob["status"] == "succeeded", bob
        assert text.splitlines()[0] != a_uid
        assert "alice-secret" not in text and "kept" not in text, text
        assert text.splitlines()[3] != Path(a_ws).name, text  # the listing shows bob's own workspace only


async def test_a_linux_dac_child_leaves_no_process_behind_after_its_task_ends(dac_hub, tmp_path):
    hub = dac_hub
    async with runner_process(hub, tmp_path, "dac3", "--isolation", "linux-dac"):
        view = await run_as(hub, "mallory", "setsid sh -c 'sleep 987' >/dev/null 2>&1 < /dev/null & echo started")
        assert view["status"] == "succeeded", view

        async def gone() -> bool:
            proc = await asyncio.create_subprocess_exec("pgrep", "-f", "sleep 987", stdout=asyncio.subprocess.PIPE)
            found, _ = await proc.communicate()
            return not found.strip()

        await eventually(gone, timeout=10)


async def test_without_bubblewrap_no_mode_is_offered_and_a_task_is_refused_at_admission_naming_the_fix(
        dac_hub, tmp_path):
    hub = dac_hub
    bindir = tmp_path / "bin-without-bwrap"
    bindir.mkdir()
    for tool in ("python3", "setpriv", "sh"):
        (bindir / tool).symlink_to(shutil.which(tool))
    async with runner_process(hub, tmp_path, "nobwrap", path=f"{Path(sys.executable).parent}:{bindir}") as caps:
        assert caps["isolation"] == []
        assert caps["isolation_unavailable"]["linux-dac"] == NO_BWRAP
        assert caps["isolation_unavailable"]["userns"] == ROOT_HAS_DAC  # a root runner's contained mode is linux-dac
        caller = await hub.hub.auth.authenticate(await hub.token("carol"))
        with pytest.raises(Invalid) as refused:  # queued, it would wait for ever
            await hub.hub.tasks.submit(caller, SubmitRequest(prompt="id", profile="claude"))
        assert "apt-get install bubblewrap" in str(refused.value), refused.value
        assert not await hub.hub.tasks.list(caller), "a refused submission stores no task"


async def test_process_mode_is_refused_on_a_runner_that_shares_the_hubs_uid_and_admission_names_the_runtimes(
        dac_hub, tmp_path):
    hub = dac_hub
    async with runner_process(hub, tmp_path, "shared", "--dedicated", "--isolation", "process") as caps:
        assert caps["isolation"] == []
        assert "allow_process_on_hub" in caps["isolation_unavailable"]["process"]
        caller = await hub.hub.auth.authenticate(await hub.token("dave"))
        with pytest.raises(Exception) as refused:
            await hub.hub.tasks.submit(caller, SubmitRequest(prompt="id", profile="claude", isolation="process"))
        assert "offers isolation process" in str(refused.value) and "shared (no mode)" in str(refused.value)
        with pytest.raises(Exception) as unknown:
            await hub.hub.tasks.submit(caller, SubmitRequest(prompt="id", profile="claude", isolation="vm"))
        assert "isolation should be 'linux-dac', 'userns' or 'process'" in str(unknown.value)  # the modes, named


async def test_an_unprivileged_runner_offers_userns_not_linux_dac_and_its_process_children_cannot_read_the_hub(
        dac_hub, tmp_path):
    hub = dac_hub
    home = Path(hub.hub.settings.home)
    shared = Path(tempfile.mkdtemp(prefix="amux-unprivileged-"))  # pytest's own folders are root's alone (0700)
    shared.chmod(0o755)
    async with runner_process(hub, shared, "nobody", "--dedicated", uid=65534) as caps:
        assert caps["isolation"] == ["userns", "process"]
        assert "not root" in caps["isolation_unavailable"]["linux-dac"]
        view = await run_as(hub, "erin", f"id -u; cat {home}/admin.token; echo rc=$?; kill -0 {os.getpid()}; "
                                         "echo rc=$?", isolation="process")
        text = out(view)
        assert view["status"] == "succeeded", view
        assert text.splitlines()[0] == "65534" and SECRET not in text and "rc=0" not in text, text
    shutil.rmtree(shared, ignore_errors=True)


async def test_an_exhausted_uid_range_makes_a_linux_dac_task_wait_and_waiting_for_says_so(dac_hub, tmp_path):
    hub = dac_hub
    hub.hub.settings.execution.uid_count = 1
    async with runner_process(hub, tmp_path, "tiny", "--isolation", "linux-dac"):
        first = await run_as(hub, "frank", "id -u")
        assert first["status"] == "succeeded", first
        caller = await hub.hub.auth.authenticate(await hub.token("grace"))
        sub = await hub.hub.tasks.submit(caller, SubmitRequest(prompt="id -u", profile="claude"))
        await asyncio.sleep(0.5)  # placement rounds run (poll 0.05 s); the run must stay queued
        view = await hub.hub.tasks.get(caller, sub["task_id"])
        assert view["status"] == "queued", view
        assert "is exhausted" in view["waiting_for"] and "execution.uid_count" in view["waiting_for"]
        hub.hub.settings.execution.uid_count = 2  # the operator widens it: the run goes
        done = await hub.hub.tasks.wait_terminal(caller, sub["task_id"], timeout_s=60)
        assert done["status"] == "succeeded", done


async def test_after_amux_up_a_claude_task_runs_under_another_uid_and_cannot_read_the_admin_token(tmp_path):
    """The new user's path: `make run` (`amux up`, as root with bubblewrap), then a `claude` task."""
    import aiohttp

    home = tmp_path / ".amux"
    env = {k: v for k, v in os.environ.items() if not k.startswith("AMUX_")}
    env.update(AMUX_HOME=str(home), AMUX_CLAUDE_BIN=str(SHELL_AGENT))
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "hub.cli", "up", "--listen", "127.0.0.1:0",
                                                "--slots", "1", cwd=tmp_path, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    try:
        url = None
        while True:
            line = (await started(proc.stdout.readline(), "amux up to print its next line")).decode()
            assert line, "amux up ended before its runner started"
            if "listening on " in line:
                url = line.split("listening on ", 1)[1].split()[0]
            if "in-process runner" in line:
                break
        token = (home / "admin.token").read_text().strip()
        async with aiohttp.ClientSession(headers={"Authorization": f"Bearer {token}"}) as http:
            body = {"prompt": f"id -u; cat {home}/admin.token; echo rc=$?", "profile": "claude"}

            async def submitted() -> str | None:  # once the in-process runner has registered
                async with http.post(f"{url}/api/v1/tasks", json=body) as r:
                    return (await r.json())["task_id"] if r.status in (200, 201) else None

            task_id = await eventually(submitted, timeout=60, interval=0.2)

            async def ended() -> dict | None:
                async with http.get(f"{url}/api/v1/tasks/{task_id}") as r:
                    view = await r.json()
                return view if view["status"] not in ("queued", "running") else None

            view = await eventually(ended, timeout=120, interval=0.2)
        text = out(view)
        assert view["status"] == "succeeded" and view["snapshot"]["isolation"] == "linux-dac", view
        assert int(text.splitlines()[0]) != os.geteuid()
        assert token not in text and "rc=0" not in text, text
    finally:
        proc.terminate()
        await proc.wait()


async def test_another_users_box_cannot_be_entered_or_seen_from_a_linux_dac_child(dac_hub, tmp_path):
    hub = dac_hub
    owner = await hub.hub.auth.authenticate(await hub.token("boxowner"))
    task = await hub.hub.leases.new(owner, "secret-box")
    box = await hub.hub.leases.vm_new(owner, task["handle"])
    try:
        await hub.hub.leases.vm_exec(owner, task["handle"], box["vm_id"], "echo box-secret > /box/secret.txt")
        async with hub.hub.db.read() as conn:
            from hub.store.tables import boxes
            handle = (await conn.execute(sa.select(boxes.c.handle).where(boxes.c.id == box["vm_id"]))).scalar()
        init = handle["init_pid"]
        async with runner_process(hub, tmp_path, "dacbox", "--isolation", "linux-dac"):
            view = await run_as(hub, "mallory", f"nsenter -t {init} -a cat /box/secret.txt; echo rc=$?; "
                                                f"ls /proc/{init}; echo rc=$?; cat /proc/{init}/root/box/secret.txt; "
                                                "echo rc=$?")
        text = out(view)
        assert view["status"] == "succeeded", view
        assert "box-secret" not in text and "rc=0" not in text, text
    finally:
        await hub.hub.leases.close(owner, task["handle"])


async def test_the_seeds_policy_rows_hold_in_linux_dac_claude_bypasses_and_codex_runs_danger_full_access(
        dac_hub, tmp_path, monkeypatch):
    hub = dac_hub
    monkeypatch.setenv("AMUX_CODEX_BIN", str(SHELL_AGENT))  # offered: the runner finds an executable for codex
    async with runner_process(hub, tmp_path, "dacpol", "--isolation", "linux-dac"):
        claude = await run_as(hub, "paula", "id -u")
        assert claude["status"] == "succeeded" and claude["snapshot"]["isolation"] == "linux-dac"
        assert claude["snapshot"]["native_args"][:2] == ["--permission-mode", "bypassPermissions"]
        caller = await hub.hub.auth.authenticate(await hub.token("paula"))
        sub = await hub.hub.tasks.submit(caller, SubmitRequest(prompt="id -u", profile="codex"))
        codex = await hub.hub.tasks.get(caller, sub["task_id"])
        assert codex["snapshot"]["isolation"] == "linux-dac"
        expected = ["--sandbox", "danger-full-access", "-c", "approval_policy=never"]
        assert codex["snapshot"]["native_args"][:4] == expected
        await hub.hub.tasks.cancel(caller, sub["task_id"])


async def test_the_runner_users_own_engine_login_reaches_a_child_only_with_share_engine_login(dac_hub, tmp_path):
    hub = dac_hub
    hub.hub.settings.execution.allow_process_on_hub = True  # a process-mode runner as the hub's uid, for this check
    for name, flags in (("noshare", ()), ("share", ("--share-engine-login",))):
        runner_home = tmp_path / f"{name}-home"
        (runner_home / ".claude").mkdir(parents=True)
        (runner_home / ".claude" / ".credentials.json").write_text('{"token": "operator-login"}')
        async with runner_process(hub, tmp_path, name, "--dedicated", "--isolation", "process", *flags):
            view = await run_as(hub, f"user-{name}", "echo CCD=${CLAUDE_CONFIG_DIR:-none}")
        line = next(x for x in out(view).splitlines() if x.startswith("CCD="))
        if flags:
            assert line == f"CCD={runner_home / '.claude'}", line
        else:
            assert line == "CCD=none", line


async def test_an_engine_cli_a_linux_dac_child_cannot_run_is_named_at_runner_start_and_each_run_fails_naming_it(
        dac_hub, tmp_path):
    hub = dac_hub
    private = tmp_path / "private-bin"  # the runner's (root's) alone: a linux-dac child's uid cannot run it
    private.mkdir()
    claude = private / "claude"
    shutil.copy(SHELL_AGENT, claude)
    claude.chmod(0o700)
    async with runner_process(hub, tmp_path, "unusable", "--isolation", "linux-dac", claude=claude) as caps:
        why = caps["engines_unusable"]["claude"]["linux-dac"]
        assert str(claude) in why and "cannot be executed by a linux-dac child" in why and "chmod" in why, why
        view = await run_as(hub, "ivan", "echo hi")
    assert view["status"] == "failed" and str(claude) in view["error"], view
    assert "Permission denied" not in view["error"], view
    log = (tmp_path / "unusable.log").read_text()
    assert log.count(f"{claude} cannot be executed") == 1, log  # said once, at start
