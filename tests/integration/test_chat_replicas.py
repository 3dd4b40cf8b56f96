"""Two hub replicas on one PostgreSQL: the chat message's webhook arrives at one, the runner reports to the other;
the progress card becomes the answer once, whichever replica drives it."""
from __future__ import annotations

import asyncio
import os
import sys

import httpx2

from hub.clock import SystemClock
from hub.config import FeishuAppSettings
from tests.fakes.feishu import FakeFeishu, card_text
from tests.helpers import REPO, eventually, runner_command, start_hub
from tests.integration.test_chat_crash import config, final_card, under
from tests.integration.test_chat_flow import all_text
from tests.integration.test_outbox_crash import free_port
from tests.integration.test_session_agent_mcp import EK, VT, post_message


async def test_a_chat_turn_taken_by_one_replica_and_reported_to_another_gets_its_answer_once(pg_url, tmp_path):
    fake = await FakeFeishu().start()
    home_b = tmp_path / "replica-b"
    config(home_b, fake)
    port = free_port()
    b_url = f"http://127.0.0.1:{port}"
    replica_b = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hub.cli", "hub", "serve", "--db", pg_url, "--listen", f"127.0.0.1:{port}", cwd=REPO,
        env={**os.environ, "AMUX_HOME": str(home_b)}, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL)
    app = FeishuAppSettings(app_id=fake.app_id, app_secret=fake.app_secret, encrypt_key=EK, verification_token=VT,
                            admin_open_id="ou_admin_crash", base_url=fake.base_url, profile="scripted")
    replica_a = await start_hub(pg_url, tmp_path / "replica-a", SystemClock(), feishu_apps=[app])
    runner = None
    try:
        async def b_ready():
            try:
                async with httpx2.AsyncClient() as http:
                    return (await http.get(f"{b_url}/readyz")).status_code == 200 and (home_b / "admin.token").exists()
            except httpx2.TransportError:
                return False
        await eventually(b_ready, timeout=420, interval=0.2)  # a loaded machine imports lark-oapi slowly
        token_b = (home_b / "admin.token").read_text().strip()
        runner = await asyncio.create_subprocess_exec(
            *runner_command(b_url, token_b, "on-b", 2, tmp_path / "ws"), cwd=REPO, env={**os.environ},
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)

        async def online():
            return any(r["status"] == "online" for r in await replica_a.hub.registry.list_runtimes())
        await eventually(online, timeout=60, interval=0.2)
        mid = await post_message(replica_a.url, fake.app_id, fake, SystemClock(), "ou_alice_rep",
                                 "tool Read 'read across replicas'\nsleep 1\nsay answered across replicas")
        doc = await final_card(fake, mid, timeout=90)
        assert "answered across replicas" in all_text(doc) and "Done" in card_text(doc)
        await asyncio.sleep(1.0)
        assert len(under(fake, mid)) == 1  # one progress card, driven to the answer by whichever replica
    finally:
        for proc in (runner, replica_b):
            if proc is not None:
                proc.kill()
                await proc.wait()
        await replica_a.stop()
        await fake.stop()
