"""Wiring of the Feishu side at start: what is loaded, what refuses to start (naming the fix), what is closed."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from hub.app import Hub
from hub.clock import ManualClock
from hub.config import FeishuAppSettings
from hub.errors import Invalid
from hub.store.db import Database
from tests.fakes import channels
from tests.helpers import REPO, hub_settings

WEBHOOK_APP = FeishuAppSettings(app_id="cli_wire", app_secret="s", admin_open_id="ou_boss")


async def test_stopping_the_hub_closes_the_alert_channel_once(sqlite_url: str, tmp_path: Path, clock: ManualClock):
    settings = hub_settings(sqlite_url, tmp_path)
    settings.feishu.apps = [WEBHOOK_APP]
    settings.feishu.channel = "tests.fakes.channels:build"
    hub = Hub(settings, Database(sqlite_url), clock)
    channel = channels.BUILT[-1]
    assert hub.alerts.channel is channel
    runner = hub.app_runner(background=True)
    await runner.setup()
    try:
        assert channel.closed == 0
    finally:
        await runner.cleanup()
        await hub.db.close()
    assert channel.closed == 1
    await hub.alerts.aclose()                       # a second close (an owner that closes too) is harmless
    assert channel.closed == 1


@pytest.mark.parametrize("spec, fix", [
    ("tests.fakes.no_such_channel:build", "install the package"),
    ("tests.fakes.channels:no_such_factory", "names no factory"),
])
async def test_a_delivery_channel_that_cannot_be_loaded_stops_the_start_naming_the_fix(
        sqlite_url: str, tmp_path: Path, clock: ManualClock, spec: str, fix: str):
    settings = hub_settings(sqlite_url, tmp_path)
    settings.feishu.apps = [WEBHOOK_APP]
    settings.feishu.channel = spec
    with pytest.raises(Invalid) as refused:
        Hub(settings, Database(sqlite_url), clock)
    assert fix in str(refused.value) and "feishu.channel" in str(refused.value)


def run_hub_start(tmp_path: Path, config: str, *, hide_lark: bool) -> subprocess.CompletedProcess:
    """Run `amux hub serve` in a fresh interpreter (lark-oapi made unimportable when `hide_lark`)."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    (home / "amux.toml").write_text(config)
    hide = "sys.modules['lark_oapi'] = None; " if hide_lark else ""
    code = (f"import sys; {hide}from hub.cli import main; "
            "sys.exit(main(['hub', 'serve', '--listen', '127.0.0.1:0']))")
    return subprocess.run([sys.executable, "-c", code], cwd=REPO, env={**os.environ, "AMUX_HOME": str(home)},
                          capture_output=True, text=True, timeout=60)


def test_without_lark_oapi_a_configured_feishu_application_stops_the_start_naming_lark_oapi(tmp_path: Path):
    done = run_hub_start(tmp_path, '[[feishu.apps]]\napp_id = "cli_x"\napp_secret = "s"\n', hide_lark=True)
    assert done.returncode == 3
    assert "lark-oapi" in done.stderr and "pip install" in done.stderr and "feishu.channel" in done.stderr


def test_without_lark_oapi_a_long_connection_application_stops_the_start_naming_lark_oapi(tmp_path: Path):
    config = ('[feishu]\nchannel = "tests.fakes.channels:build"\n'
              '[[feishu.apps]]\napp_id = "cli_lc"\napp_secret = "s"\nmode = "long-connection"\n')
    done = run_hub_start(tmp_path, config, hide_lark=True)
    assert done.returncode == 3
    assert "cli_lc" in done.stderr and "long-connection" in done.stderr and "pip install 'lark-oapi" in done.stderr


def test_a_hub_without_feishu_applications_starts_and_serves_without_importing_lark_oapi(tmp_path: Path):
    code = """
import asyncio, sys
from hub.app import Hub
from hub.config_sources import load_settings
from hub.store.db import upgrade

async def main():
    settings = load_settings(env={}, home=sys.argv[1])
    await upgrade(settings.db_url())
    hub = Hub(settings)
    runner = hub.app_runner(background=True)
    await runner.setup()
    await runner.cleanup()
    await hub.db.close()
    print(sorted(m for m in sys.modules if m.split('.')[0] == 'lark_oapi'))

asyncio.run(main())
"""
    done = subprocess.run([sys.executable, "-c", code, str(tmp_path / "home")], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env={k: v for k, v in os.environ.items() if k != "AMUX_HOME"})
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == "[]"
