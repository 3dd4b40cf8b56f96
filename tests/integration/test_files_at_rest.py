"""Files at rest: AMUX_HOME is 0700; the SQLite database, its WAL/SHM, the tokens and the secret key are 0600."""
from __future__ import annotations

import asyncio
import os
import stat
import sys
from pathlib import Path

import sqlalchemy as sa

from hub.app import embedded_secret_key
from hub.store.db import Database, upgrade
from tests.helpers import REPO, started


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


async def test_amux_up_creates_its_home_0700_and_its_database_wal_shm_tokens_and_secret_key_0600(tmp_path):
    home = tmp_path / "home"
    env = {**os.environ, "AMUX_HOME": str(home)}
    env.pop("AMUX_DATABASE_URL", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import os, sys; os.umask(0o022); from hub.cli import main; sys.exit(main())",
        "up", "--listen", "127.0.0.1:0", "--slots", "1", cwd=REPO, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        async def ready() -> bool:
            return all((home / n).exists() for n in ("admin.token", "runner.token", "amux.db-wal", "amux.db-shm"))
        await started(ready, "amux up", proc=proc)
        assert mode(home) == 0o700
        for name in ("amux.db", "amux.db-wal", "amux.db-shm", "admin.token", "runner.token", "secret.key"):
            assert mode(home / name) == 0o600, (name, oct(mode(home / name)))
    finally:
        proc.terminate()
        await proc.wait()


async def test_an_existing_sqlite_database_and_its_wal_are_tightened_to_0600(tmp_path):
    path = tmp_path / "old.db"
    url = f"sqlite+aiosqlite:///{path}"
    await upgrade(url)
    for side in (path, Path(f"{path}-wal")):
        side.touch()
        side.chmod(0o644)
    db = Database(url)
    try:
        async with db.write() as conn:
            await conn.execute(sa.text("select 1"))
        assert mode(path) == 0o600 and mode(Path(f"{path}-wal")) == 0o600
    finally:
        await db.close()


async def test_a_new_sqlite_database_is_0600_with_its_wal_and_shm_under_a_permissive_umask(tmp_path):
    old = os.umask(0)
    try:
        path = tmp_path / "fresh" / "amux.db"
        db = Database(f"sqlite+aiosqlite:///{path}")
        async with db.write() as conn:
            await conn.execute(sa.text("create table t (x int)"))
            await conn.execute(sa.text("insert into t values (1)"))
        assert mode(path) == 0o600
        for side in ("-wal", "-shm"):
            assert mode(Path(f"{path}{side}")) == 0o600, side
        await db.close()
    finally:
        os.umask(old)


def test_the_embedded_secret_key_is_0600_in_a_0700_home_even_when_the_home_existed_open(tmp_path):
    home = tmp_path / "h"
    home.mkdir(mode=0o755)
    home.chmod(0o755)
    key = embedded_secret_key(home)
    assert key and mode(home) == 0o700 and mode(home / "secret.key") == 0o600


async def test_an_older_admin_runner_token_file_is_replaced_by_a_runner_token_and_revoked(hub, tmp_path):
    from hub.cli.serve import _token_file
    from hub.errors import Unauthorized
    import pytest

    old = await hub.hub.auth.create_token("local-runner", label="runner", admin=True)
    path = tmp_path / "runner.token"
    path.write_text(old + "\n")
    path.chmod(0o644)
    new = await _token_file(hub.hub, path, "local-runner", "runner", runner=True)
    assert new != old and mode(path) == 0o600
    assert (await hub.hub.auth.authenticate(new, surface="runner")).kind == "runner"
    with pytest.raises(Unauthorized):
        await hub.hub.auth.authenticate(old)
