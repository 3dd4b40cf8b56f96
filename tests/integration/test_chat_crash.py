"""kill -9 of the hub in the middle of a chat Turn, then a restart: the chat hears what happened, exactly once.

On the embedded store (`amux up`: the hub and its in-process runner die together) the Turn is orphaned; after the
restart it ends with an outcome and its progress card says so, in both languages, with what to do. On PostgreSQL
(`amux hub serve` and a separate runner that survives) the runner reconnects with the Turn's outcome and the card
becomes the answer. Either way the Feishu log shows the one progress card under the message, never a second.
"""
from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
from pathlib import Path

import httpx2
import pytest

from hub.clock import SystemClock
from tests.fakes.feishu import FakeFeishu, card_text
from tests.helpers import REPO, eventually, runner_command
from tests.integration.test_chat_flow import all_text
from tests.integration.test_outbox_crash import free_port
from tests.integration.test_session_agent_mcp import EK, VT, post_message

ALICE = "ou_alice_crash"


def config(home: Path, fake: FakeFeishu) -> None:
    home.mkdir(exist_ok=True)
    (home / "amux.toml").write_text(f"""
[hub]
poll_s = 0.05
[alerts]
retry_base_s = 0.2
poll_s = 0.1
lease_s = 2
[feishu]
chat_update_s = 0.5
[[feishu.apps]]
app_id = "{fake.app_id}"
app_secret = "{fake.app_secret}"
admin_open_id = "ou_admin_crash"
encrypt_key = "{EK}"
verification_token = "{VT}"
base_url = "{fake.base_url}"
profile = "scripted"
""")


async def spawn(args: list[str], home: Path, port: int, *, runner: bool) -> asyncio.subprocess.Process:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hub.cli", *args, "--listen", f"127.0.0.1:{port}", cwd=REPO,
        env={**os.environ, "AMUX_HOME": str(home)}, stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL)

    async def ready():
        try:
            async with httpx2.AsyncClient() as http:
                if (await http.get(f"http://127.0.0.1:{port}/readyz")).status_code != 200:
                    return False
                if not (home / "admin.token").exists():
                    return False
                if not runner:
                    return True
                auth = {"Authorization": f"Bearer {(home / 'admin.token').read_text().strip()}"}
                listed = await http.get(f"http://127.0.0.1:{port}/api/v1/runtimes", headers=auth)
                return listed.status_code == 200 and any(r["status"] == "online" for r in listed.json()["runtimes"])
        except httpx2.TransportError:
            return False

    await eventually(ready, timeout=420, interval=0.1)  # a loaded machine imports lark-oapi slowly
    return proc


def under(fake: FakeFeishu, mid: str) -> list:
    return [m for m in fake.sent if m.reply_to == mid]


async def final_card(fake: FakeFeishu, mid: str, timeout: float = 60) -> dict:
    async def done():
        got = under(fake, mid)
        if not got:
            return None
        doc = got[0].updates[-1] if got[0].updates else got[0].content
        return None if '"op": "stop"' in json.dumps(doc) else doc
    return await eventually(done, timeout=timeout, interval=0.1)


async def kill_mid_turn(proc: asyncio.subprocess.Process, fake: FakeFeishu, mid: str) -> None:
    await eventually(lambda: _async(under(fake, mid)), timeout=60, interval=0.05)  # its progress card arrived
    await asyncio.sleep(1.5)  # the Turn is under way
    os.kill(proc.pid, signal.SIGKILL)
    await proc.wait()


async def _async(v):
    return v


async def test_kill_9_mid_turn_on_the_embedded_store_tells_the_chat_it_was_interrupted_once(tmp_path):
    fake = await FakeFeishu().start()
    home = tmp_path / "home"
    config(home, fake)
    port = free_port()
    hub = await spawn(["up", "--slots", "2"], home, port, runner=True)
    try:
        mid = await post_message(f"http://127.0.0.1:{port}", fake.app_id, fake, SystemClock(), ALICE,
                                 "tool Bash 'build the release'\nsleep 30\nsay never")
        await kill_mid_turn(hub, fake, mid)
        hub = await spawn(["up", "--slots", "2"], home, port, runner=True)
        doc = await final_card(fake, mid)
        assert "interrupted" in card_text(doc) and "Send your message again" in card_text(doc)
        assert "中断" in card_text(doc, "zh_cn") and "重新发送" in card_text(doc, "zh_cn")
        await asyncio.sleep(1.0)  # nothing more comes
        assert len(under(fake, mid)) == 1  # one progress card: never a second for the same message
    finally:
        hub.kill()
        await hub.wait()
        await fake.stop()


async def test_kill_9_of_a_postgres_hub_mid_turn_delivers_the_answer_once_after_restart(pg_url, tmp_path):
    fake = await FakeFeishu().start()
    home = tmp_path / "home"
    config(home, fake)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    hub = await spawn(["hub", "serve", "--db", pg_url], home, port, runner=False)
    token = (home / "admin.token").read_text().strip()
    runner = await asyncio.create_subprocess_exec(
        *runner_command(url, token, "survivor", 2, tmp_path / "ws"), cwd=REPO, env={**os.environ},
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
    try:
        async def online():
            try:
                async with httpx2.AsyncClient() as http:
                    r = await http.get(f"{url}/api/v1/runtimes", headers={"Authorization": f"Bearer {token}"})
                return any(x["status"] == "online" for x in r.json()["runtimes"])
            except httpx2.TransportError:
                return False
        await eventually(online, timeout=60, interval=0.1)
        mid = await post_message(url, fake.app_id, fake, SystemClock(), ALICE,
                                 "tool Read 'read the notes'\nsleep 5\nsay finished after the crash")
        await kill_mid_turn(hub, fake, mid)
        hub = await spawn(["hub", "serve", "--db", pg_url], home, port, runner=False)
        doc = await final_card(fake, mid, timeout=90)
        assert "finished after the crash" in all_text(doc) and "Done" in card_text(doc)
        await asyncio.sleep(1.0)
        assert len(under(fake, mid)) == 1
    finally:
        for p in (runner, hub):
            p.kill()
            await p.wait()
        await fake.stop()


pytestmark = pytest.mark.filterwarnings("ignore::ResourceWarning")
