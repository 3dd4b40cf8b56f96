"""Feishu error 230053 ("the user has stopped the bot from sending messages") suspends delivery, end to end on both
stores: a failing schedule's card goes out through the real lark-oapi SDK to the fake Feishu server, which answers
230053; delivery of that application is suspended (no retry, no other recipient), `amux alerts list` shows the
diagnostic, and only `amux feishu recheck --app` (the CLI as a subprocess, over REST) lifts it."""
from __future__ import annotations

import json
from pathlib import Path

from aiohttp import web

from tests.fakes.feishu import FakeFeishu, clock_seconds
from tests.integration.test_alerts_feishu import ADMIN, make_env
from tests.integration.test_cli_rest import amux


async def test_230053_from_feishu_suspends_delivery_until_the_operator_rechecks(db_url, tmp_path: Path, clock):
    fake = await FakeFeishu(now=clock_seconds(clock)).start()
    env = await (await make_env(db_url, tmp_path, clock, fake)).setup()
    runner = web.AppRunner(env.hub.web_app(background=False), access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    cli = {"AMUX_HUB_URL": f"http://127.0.0.1:{runner.addresses[0][1]}",
           "AMUX_TOKEN": await env.hub.auth.create_token("ops", admin=True)}
    try:
        fake.fail("230053", op="send")
        await env.fire("failed")
        await env.round(61)
        sends = [r for r in fake.requests if r[0] == "send"]
        assert len(sends) == 1 and fake.sent == []          # tried once, refused with 230053
        await env.round(3600)
        assert [r for r in fake.requests if r[0] == "send"] == sends  # suspended: never retried on its own
        assert {r[2].get("receive_id") for r in fake.requests if r[0] in ("send", "reply")} <= {ADMIN}  # no fallback
        code, out, err = await amux("alerts", "list", "--json", env=cli)
        assert code == 0, err
        [diag] = json.loads(out)["diagnostics"]
        assert "230053" in json.dumps(diag) and "recheck" in json.dumps(diag)
        [state] = [d for d in await env.hub.alerts.diagnostics() if d.get("app_id") == fake.app_id]
        assert state["delivery_state"] == "suspended"
        code, out, err = await amux("feishu", "recheck", "--app", fake.app_id, "--json", env=cli)
        assert code == 0, err
        assert json.loads(out)["delivery_state"] == "ok"
        await env.round()
        assert len(fake.sent) == 1 and fake.sent[0].receive_id == ADMIN  # the held card, once
    finally:
        await runner.cleanup()
        await env.hub.db.close()
        await fake.stop()
