"""The escape suite for the rootless mode, userns: the runner is an ordinary user (root makes it one, `nobody`), the
hub's home is that user's own, as when that user runs `amux up`, and a stand-in agent runs its prompt as a shell
command. Each attempt to reach the hub's secrets, the runner's process, the database, other principals' workspaces,
homes and children fails inside the sandbox, and the same attempts succeed for a process-mode child of the same
runner (so the files and processes are really that uid's to take: the sandbox is what stops them).
"""
from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from hub.errors import Invalid
from hub.runner import boundary
from hub.services.tasks.service import SubmitRequest
from tests.helpers import eventually, start_hub
from tests.integration.test_task_child_boundary import BWRAP, ORDINARY_WORK, SECRET, out, run_as, runner_process

NOBODY = 65534


def _userns_works() -> bool:
    if BWRAP is None or os.geteuid() != 0:
        return False
    probe = f"import os; os.setgid({NOBODY}); os.setuid({NOBODY}); os.execv({BWRAP!r}, [{BWRAP!r}, " \
            "'--unshare-user', '--ro-bind', '/', '/', 'true'])"
    import subprocess
    return subprocess.run([sys.executable, "-c", probe], capture_output=True, timeout=20).returncode == 0


pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="user namespaces are Linux's"),
    pytest.mark.skipif(os.geteuid() != 0, reason="root makes the unprivileged runner user (CI runs the suite as root)"),
    pytest.mark.skipif(BWRAP is None, reason="bubblewrap is not installed (make test installs it)"),
    pytest.mark.skipif(not _userns_works(), reason="unprivileged user namespaces are unavailable on this machine"),
]


@pytest.fixture
async def userns_hub(sqlite_url: str, clock):
    """A hub whose home belongs to the runner's user (`nobody`) and holds the secrets an agent would go for."""
    shared = Path(tempfile.mkdtemp(prefix="amux-userns-"))  # pytest's own folders are root's alone (0700)
    shared.chmod(0o755)
    home = shared / "hubhome"
    handle = await start_hub(sqlite_url, home, clock)
    handle.hub.settings.execution.allow_process_on_hub = False
    for name in ("admin.token", "secret.key", "runner.token"):
        (home / name).write_text(SECRET)
        (home / name).chmod(0o600)
    for path in (home, *home.rglob("*")):
        os.chown(path, NOBODY, NOBODY)
    yield handle, shared
    await handle.stop()
    shutil.rmtree(shared, ignore_errors=True)


async def test_a_userns_child_of_an_unprivileged_runner_reaches_neither_the_hub_its_secrets_nor_the_runner(
        userns_hub):
    hub, shared = userns_hub
    home = Path(hub.hub.settings.home)
    other = await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", 0)  # a service on the runner's loopback
    other_port = other.sockets[0].getsockname()[1]
    owner = await hub.hub.auth.authenticate(await hub.token("boxowner"))
    lease = await hub.hub.leases.new(owner, "secret-box")
    box = await hub.hub.leases.vm_new(owner, lease["handle"])
    try:
        await hub.hub.leases.vm_exec(owner, lease["handle"], box["vm_id"], "echo box-secret > /box/secret.txt")
        init = await _box_init(hub, box["vm_id"])
        async with runner_process(hub, shared, "rootless", "--dedicated", uid=NOBODY) as caps:
            assert caps["isolation"] == ["userns", "process"], caps
            assert "not root" in caps["isolation_unavailable"]["linux-dac"]
            runner = caps["runner_pid"]
            reached = {  # what the runner's uid can take outside the sandbox
                "admin.token": f"cat {home}/admin.token",
                "secret.key": f"cat {home}/secret.key",
                "hub home": f"ls {home}",
                "runner environ (its token)": f"cat /proc/{runner}/environ",
                "signal the runner": f"kill -0 {runner}",
                "write the hub home": f"touch {home}/escaped-process && rm {home}/escaped-process",
            }
            control = await run_as(hub, "mallory", "; ".join(f"{c} > /dev/null 2>&1; echo rc=$?"
                                                             for c in reached.values()), isolation="process")
            assert out(control).count("rc=0") == len(reached), out(control)  # the attempts are real ones
            attempts = {
                **reached,
                "write the hub home": f"touch {home}/escaped",
                "hub environ": f"cat /proc/{os.getpid()}/environ",
                "postgres": "python3 -c \"import socket; socket.create_connection(('127.0.0.1', 5432), 3)\"",
                "another loopback service": f"python3 -c \"import socket; socket.create_connection(('127.0.0.1', "
                                            f"{other_port}), 3)\"",
                "the egress proxy to loopback": f"python3 -c \"import urllib.request; urllib.request.urlopen("
                                                f"'https://127.0.0.1:{other_port}/', timeout=5)\"",
                "write the system": "touch /usr/escaped",
                "enter the host's namespaces": "nsenter -t 1 -m -p true",
                "a nested user namespace": "unshare -U -r true",
                "gain a capability": "grep CapEff /proc/self/status | grep -v 0000000000000000",
                "the box": f"nsenter -t {init} -a cat /box/secret.txt",
                "the box's root": f"cat /proc/{init}/root/box/secret.txt",
                "host root's files": "ls -A /root | grep -v -x .pyenv",
            }
            for what, command in attempts.items():
                view = await run_as(hub, "mallory", f"{command}; echo rc=$?", isolation="userns")
                text = out(view)
                assert view["status"] == "succeeded" and view["snapshot"]["isolation"] == "userns", (what, text)
                assert SECRET not in text and "box-secret" not in text, (what, text)
                assert "rc=0" not in text, (what, text)
            assert not (home / "escaped").exists() and not Path("/usr/escaped").exists()
            # An omitted mode is userns on this runner, and the child still does ordinary work: its workspace,
            # python3, /usr, the hub's MCP endpoint through the bridged port.
            view = await run_as(hub, "mallory", ORDINARY_WORK)
        text = out(view)
        assert view["status"] == "succeeded" and view["snapshot"]["isolation"] == "userns", view
        lines = text.splitlines()
        assert lines[0] == "work" and lines[3] == "42" and lines[5] == "200" and lines[6] == "mallory", text
        assert int(lines[1]) == NOBODY  # the runner's uid: userns keeps it
        assert (Path(lines[2]) / "out.txt").stat().st_uid == NOBODY
        assert view["changed_files"]["created"] == ["out.txt"]
    finally:
        other.close()
        await hub.hub.leases.close(owner, lease["handle"])


async def _box_init(hub, vm_id: str) -> int:
    import sqlalchemy as sa

    from hub.store.tables import boxes
    async with hub.hub.db.read() as conn:
        handle = (await conn.execute(sa.select(boxes.c.handle).where(boxes.c.id == vm_id))).scalar()
    return int(handle["init_pid"])


async def test_userns_principals_share_the_runners_uid_but_not_workspaces_homes_or_children(userns_hub):
    hub, shared = userns_hub
    async with runner_process(hub, shared, "rootless2", uid=NOBODY) as caps:
        assert caps["isolation"] == ["userns"], caps
        alice = await run_as(hub, "alice", "echo alice-secret > mine.txt && echo kept > $HOME/notes && pwd && "
                                           "echo $HOME")
        assert alice["status"] == "succeeded", alice
        a_ws, a_home = out(alice).splitlines()[:2]
        again = await run_as(hub, "alice", "cat $HOME/notes")
        assert out(again).splitlines()[0] == "kept"  # the principal's home persists between runs
        caller = await hub.hub.auth.authenticate(await hub.token("alice"))
        running = await hub.hub.tasks.submit(caller, SubmitRequest(prompt="sleep 30 # alice-marker", profile="claude"))

        async def alice_runs() -> bool:
            return (await hub.hub.tasks.get(caller, running["task_id"]))["status"] == "running"

        await eventually(alice_runs, timeout=30)
        bob = await run_as(hub, "bob", f"cat {a_ws}/mine.txt 2>/dev/null; echo rc=$?; cat {a_home}/notes 2>/dev/null; "
                                       f"echo rc=$?; ls {Path(a_ws).parent} | tr '\\n' ' '; echo; "
                                       "ps -eo args | grep -c 'alice-mark[e]r'; pkill -f 'alice-mark[e]r'; echo rc=$?")
        text = out(bob)
        assert bob["status"] == "succeeded", bob
        lines = text.splitlines()
        assert lines[:2] == ["rc=1", "rc=1"], text  # alice's workspace and home are not there
        assert lines[2].split() == [bob["task_id"]], text  # bob's listing shows his own workspace only
        assert lines[3:5] == ["0", "rc=1"], text  # alice's child is neither seen nor signalled
        assert (await hub.hub.tasks.get(caller, running["task_id"]))["status"] == "running"  # alice's child lives
        await hub.hub.tasks.cancel(caller, running["task_id"])


async def test_a_userns_child_leaves_no_process_behind_after_its_task_ends(userns_hub):
    hub, shared = userns_hub
    async with runner_process(hub, shared, "rootless3", uid=NOBODY):
        view = await run_as(hub, "mallory", "setsid sh -c 'sleep 988' >/dev/null 2>&1 < /dev/null & echo started")
        assert view["status"] == "succeeded" and view["snapshot"]["isolation"] == "userns", view

        async def gone() -> bool:
            proc = await asyncio.create_subprocess_exec("pgrep", "-f", "sleep 988", stdout=asyncio.subprocess.PIPE)
            found, _ = await proc.communicate()
            return not found.strip()

        await eventually(gone, timeout=10)


FAILING_BWRAP = """#!/bin/sh
# bubblewrap where the kernel refuses an ordinary user a user namespace (its real message)
echo "bwrap: No permissions to creating new namespace, likely because the kernel does not allow non-privileged \
user namespaces. On e.g. debian this can be enabled with 'sysctl kernel.unprivileged_userns_clone=1'." >&2
exit 1
"""


async def test_where_user_namespaces_fail_the_runner_says_so_once_and_a_task_is_refused_at_admission_naming_the_fix(
        userns_hub):
    hub, shared = userns_hub
    bindir = shared / "failing-bwrap"
    bindir.mkdir()
    (bindir / "bwrap").write_text(FAILING_BWRAP)
    (bindir / "bwrap").chmod(0o755)
    async with runner_process(hub, shared, "nouserns", uid=NOBODY, path=f"{bindir}:{os.environ['PATH']}") as caps:
        assert caps["isolation"] == [], caps
        why = caps["isolation_unavailable"]["userns"]
        assert "could not make a user namespace" in why and "unprivileged_userns_clone" in why, why
        caller = await hub.hub.auth.authenticate(await hub.token("carol"))
        with pytest.raises(Invalid) as refused:
            await hub.hub.tasks.submit(caller, SubmitRequest(prompt="id", profile="claude"))
        assert "userns: bubblewrap could not make a user namespace" in str(refused.value), refused.value
        assert "sysctl" in str(refused.value)
    log = (shared / "nouserns.log").read_text()
    assert log.count("can run no task child") == 1, log


@pytest.mark.parametrize(("sysctl", "value", "fix"), [
    ("kernel/unprivileged_userns_clone", "0", "sysctl -w kernel.unprivileged_userns_clone=1"),
    ("user/max_user_namespaces", "0", "sysctl -w user.max_user_namespaces=15000"),
    ("kernel/apparmor_restrict_unprivileged_userns", "1", "kernel.apparmor_restrict_unprivileged_userns=0"),
])
def test_a_refused_user_namespace_names_the_sysctl_or_apparmor_rule_that_refused_it(tmp_path, monkeypatch, sysctl,
                                                                                    value, fix):
    (tmp_path / sysctl).parent.mkdir(parents=True, exist_ok=True)
    (tmp_path / sysctl).write_text(value + "\n")
    monkeypatch.setattr(boundary, "SYSCTL", tmp_path)
    assert fix in boundary.userns_fix()


async def test_codex_pi_and_the_scripted_subprocess_run_in_userns_on_an_unprivileged_runner_with_no_flag(
        userns_hub, monkeypatch):
    hub, shared = userns_hub
    fakes = Path(__file__).resolve().parent.parent / "fakes" / "bin"
    monkeypatch.setenv("AMUX_CODEX_BIN", str(fakes / "codex"))  # the recorded-stream stand-ins of the real CLIs
    monkeypatch.setenv("AMUX_PI_BIN", str(fakes / "pi"))
    async with runner_process(hub, shared, "engines", uid=NOBODY) as caps:
        assert {"codex", "pi", "scripted"} <= set(caps["engines"]) and not caps["engines_unusable"], caps
        caller = await hub.hub.auth.authenticate(await hub.token("ursula"))
        for profile, args in (("codex", None), ("pi", None), ("scripted", ["--subprocess"])):
            sub = await hub.hub.tasks.submit(caller, SubmitRequest(prompt="say hi", profile=profile,
                                                                   extra_args=args))
            view = await hub.hub.tasks.wait_terminal(caller, sub["task_id"], timeout_s=60)
            assert view["status"] == "succeeded", (profile, view["error"])
            assert view["snapshot"]["isolation"] == "userns", (profile, view["snapshot"])
