"""The ordinary user's journey: a fresh unprivileged Linux user (root makes it) installs the project with
`pip install .` into a virtualenv of their own, runs `amux up` as themselves with a claude-shaped stand-in agent
on their PATH, and submits `amux task submit --profile claude --wait`: the task runs contained (the rootless mode,
userns) with no extra flag, succeeds, and its child cannot read the hub's `admin.token`, which is that same user's
file.
"""
from __future__ import annotations

import asyncio
import json
import os
import pwd
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, started
from tests.integration.test_task_child_boundary import BWRAP, SHELL_AGENT
from tests.integration.test_userns_boundary import _userns_works

USER = "amux-journey"
pytestmark = [
    pytest.mark.skipif(sys.platform != "linux", reason="user namespaces are Linux's"),
    pytest.mark.skipif(os.geteuid() != 0, reason="root makes the unprivileged user; the suite runs as root in CI"),
    pytest.mark.skipif(shutil.which("useradd") is None, reason="useradd is missing (apt-get install passwd)"),
    pytest.mark.skipif(BWRAP is None, reason="bubblewrap is not installed (make test installs it)"),
    pytest.mark.skipif(not _userns_works(), reason="unprivileged user namespaces are unavailable on this machine"),
]
SKIP = shutil.ignore_patterns(".git", ".venv", "node_modules", ".amux", "__pycache__", "*.egg-info", "build",
                              ".pytest_cache", ".mypy_cache", ".ruff_cache")


def the_user() -> pwd.struct_passwd:
    """The journey's user, made once per machine (its home keeps pip's cache between runs)."""
    try:
        return pwd.getpwnam(USER)
    except KeyError:
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", USER], check=True)
        return pwd.getpwnam(USER)


async def test_an_ordinary_user_pip_installs_amux_runs_amux_up_and_a_claude_task_runs_contained():
    user = the_user()
    home = Path(user.pw_dir)
    for stale in ("src", "venv", "bin", ".amux", "work"):  # a fresh start each run; ~/.cache stays
        shutil.rmtree(home / stale, ignore_errors=True)
    shutil.copytree(REPO, home / "src", ignore=SKIP)
    (home / "bin").mkdir()
    shutil.copy(SHELL_AGENT, home / "bin" / "claude")
    (home / "work").mkdir()
    for path in (home, *(p for d in ("src", "bin", "work") for p in (home / d, *(home / d).rglob("*")))):
        os.chown(path, user.pw_uid, user.pw_gid, follow_symlinks=False)
    os.chmod(home, 0o700)  # a home no one else reads: the hub's secrets live in it
    env = {"HOME": str(home), "USER": USER, "LOGNAME": USER, "LANG": "C.UTF-8",
           "PATH": f"{home}/bin:{home}/venv/bin:/usr/local/bin:/usr/bin:/bin",
           "AMUX_HOME": str(home / ".amux")}
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST"):  # the machine's registry, if set
        if name in os.environ:
            env[name] = os.environ[name]

    def as_user() -> None:
        os.setgroups([])
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)

    async def run(*argv: str, timeout: float = 900) -> str:
        proc = await asyncio.create_subprocess_exec(*argv, cwd=home / "work", env=env, preexec_fn=as_user,
                                                    stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        output, _ = await asyncio.wait_for(proc.communicate(), timeout)
        text = output.decode(errors="replace")
        assert proc.returncode == 0, (argv, text[-3000:])
        return text

    await run("/usr/bin/python3", "-m", "venv", str(home / "venv"))
    pip = str(home / "venv" / "bin" / "pip")
    await run(pip, "install", "--quiet", "--disable-pip-version-check", str(home / "src"))
    up = await asyncio.create_subprocess_exec(str(home / "venv" / "bin" / "amux"), "up", "--listen", "127.0.0.1:0",
                                              "--slots", "1", cwd=home / "work", env=env, preexec_fn=as_user,
                                              stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
    seen: list[str] = []
    try:
        while True:
            line = (await started(up.stdout.readline(), "amux up to print its next line")).decode()
            assert line, f"amux up ended before its runner started: {''.join(seen)}"
            seen.append(line)
            if "in-process runner" in line:
                break
        assert "claude" in line, seen  # the stand-in on the user's PATH is found
        token = (home / ".amux" / "admin.token").read_text().strip()
        amux = str(home / "venv" / "bin" / "amux")
        text = await run(amux, "task", "submit", "--profile", "claude", "--wait",
                         f"id -u; cat {home}/.amux/admin.token; echo rc=$?; echo hello")
        assert "hello" in text and token not in text, text
        task_id = next(w for w in text.split() if w.startswith("tr_"))
        view = json.loads(await run(amux, "task", "get", task_id, "--json"))
        result = (view.get("result") or {}).get("text") or ""
        assert view["status"] == "succeeded", view
        assert view["snapshot"]["isolation"] == "userns", view["snapshot"]  # no flag: the default for this user
        assert result.splitlines()[0] == str(user.pw_uid), result
        assert token not in result and "rc=0" not in result and "hello" in result, result
    finally:
        up.terminate()
        await up.wait()
