"""kill -9 of a hub while it is sending a notice: after restart the Feishu log shows each notice exactly once."""
from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
from pathlib import Path

import httpx2
import sqlalchemy as sa

from hub.ids import new_id
from hub.store.db import Database
from hub.store.tables import api_tokens, identity_bindings, outbox, schedules
from tests.fakes.feishu import FakeFeishu
from tests.helpers import REPO, eventually, started

ADMIN = "ou_admin_crash"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def start_hub(home: Path, port: int) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hub.cli", "up", "--listen", f"127.0.0.1:{port}", "--slots", "2", cwd=REPO,
        env={**os.environ, "AMUX_HOME": str(home)}, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL)

    async def ready():  # serving, and its in-process runner registered (a schedule is refused without a runtime)
        try:
            async with httpx2.AsyncClient() as http:
                if (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code != 200:
                    return False
                if not (home / "admin.token").exists():
                    return False
                auth = {"Authorization": f"Bearer {(home / 'admin.token').read_text().strip()}"}
                listed = await http.get(f"http://127.0.0.1:{port}/api/v1/runtimes", headers=auth)
                return listed.status_code == 200 and any(r["status"] == "online" for r in listed.json()["runtimes"])
        except httpx2.TransportError:
            return False

    await started(ready, "amux up to serve with its runner online", proc=proc, interval=0.1)
    return proc


# Long by design: one kill-and-restart journey over real processes; the checks follow its order.
async def test_kill_9_while_sending_then_restart_delivers_each_notice_exactly_once(tmp_path):
    fake = await FakeFeishu(slow_s=3.0).start()
    home = tmp_path / "home"
    home.mkdir()
    (home / "amux.toml").write_text(f"""
[hub]
poll_s = 0.05
[schedules]
poll_s = 0.1
[alerts]
aggregation_s = 0.5
quiet_hours = ""
lease_s = 2
retry_base_s = 0.2
poll_s = 0.1
[[feishu.apps]]
app_id = "{fake.app_id}"
app_secret = "{fake.app_secret}"
admin_open_id = "{ADMIN}"
verification_token = "vt"
base_url = "{fake.base_url}"
""")
    port = free_port()
    hub = await start_hub(home, port)
    db = Database(f"sqlite+aiosqlite:///{home / 'amux.db'}")
    try:
        token = (home / "admin.token").read_text().strip()
        async with db.write() as conn:  # the admin principal is known in this app: its schedules are attributable
            principal = (await conn.execute(sa.select(api_tokens.c.principal_id).where(
                api_tokens.c.label == "cli"))).scalar()
            await conn.execute(identity_bindings.insert().values(
                id=new_id("ib"), principal_id=principal, app_id=fake.app_id, open_id="ou_creator", status="active",
                created_at=sa.func.now()))
        fake.fail("slow", times=1, op="send")  # the first send hangs for 3 s: the hub dies inside it
        async with httpx2.AsyncClient(base_url=f"http://127.0.0.1:{port}",
                                      headers={"Authorization": f"Bearer {token}"}) as http:
            res = await http.post("/api/v1/schedules", json={"prompt": "fail boom", "profile": "scripted",
                                                               "rule": "every 1h", "name": "crashy"})
            assert res.status_code == 201, res.text
        async with db.write() as conn:  # fire now rather than in an hour
            await conn.execute(schedules.update().values(next_fire_at=sa.func.now()))

        async def sending():
            return [r for r in fake.requests if r[0] == "send"]

        first = await eventually(sending, timeout=60, interval=0.05)
        os.kill(hub.pid, signal.SIGKILL)  # mid-send: Feishu accepts the message, the hub never hears back
        await hub.wait()
        await eventually(lambda: _count(fake.sent), timeout=10)
        hub = await start_hub(home, port)

        async def resent():
            return len([r for r in fake.requests if r[0] == "send" and r[1] == first[0][1]]) >= 2

        await eventually(resent, timeout=30, interval=0.1)

        async def delivered():
            async with db.read() as conn:
                return (await conn.execute(sa.select(outbox.c.state, outbox.c.message_id)
                                           .where(outbox.c.request_uuid == first[0][1]))).first()

        row = await eventually(lambda: _sent_row(delivered), timeout=20)
        assert len(fake.sent_to(ADMIN)) == 1                         # exactly once in the Feishu log
        assert row.message_id == fake.sent_to(ADMIN)[0].message_id   # the resend got the same message back
    finally:
        hub.kill()
        await hub.wait()
        await db.close()
        await fake.stop()


async def _count(items):
    return len(items)


async def _sent_row(delivered):
    row = await delivered()
    return row if row is not None and row.state == "sent" else None
