"""The real engine CLIs (pinned in tests/clients, installed by `make test`) launched by a task, offline.

No network and no key here: the model API is a closed loopback port, or a fake that rejects every key.
What the suite checks is what a person sees when an engine struggles: the CLI's retries become status
events on the task (`engine retrying: attempt 2 of 3 (connection error)`), the final error names the
cause and what to check instead of a bare timeout, and a rejected key fails at once with the CLI's own
message. Retry counts are shortened through the CLIs' own settings (Claude Code: CLAUDE_CODE_MAX_RETRIES,
passed like any credential through a credential profile), so each case ends in seconds.
"""
from __future__ import annotations

import asyncio
import json
import socket
from pathlib import Path

import pytest
import sqlalchemy as sa

from hub.engines.claude import ClaudeEngine
from hub.engines.codex import CodexEngine
from hub.runner.agent import Runner
from hub.services.tasks.service import SubmitRequest
from hub.store.tables import api_tokens, task_events
from tests.fakes.model_api import RejectingModelApi
from tests.helpers import PROCESS_MODE, REPO, started

BIN = REPO / "tests" / "clients" / "node_modules" / ".bin"


def need(tool: str) -> Path:
    """Return the installed pinned CLI, or fail naming the install command (never skip)."""
    path = BIN / tool
    if not path.exists():
        pytest.fail(f"{path} is missing: run `make test` (or `npm ci --prefix tests/clients`)")
    return path


def closed_port() -> int:
    """A loopback port nothing listens on: every connection is refused at once."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def engine_host(monkeypatch, tmp_path):
    """The runner's own environment: no operator login to share, the real CLIs as the engines."""
    monkeypatch.setenv("HOME", str(tmp_path / "runner-home"))
    (tmp_path / "runner-home").mkdir()
    for var in ("CLAUDE_CONFIG_DIR", "CODEX_HOME", "ANTHROPIC_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("AMUX_CLAUDE_BIN", str(need("claude")))
    monkeypatch.setenv("AMUX_CODEX_BIN", str(need("codex")))


async def start(hub, tmp_path: Path, credentials: dict[str, str]):
    """Start a runner offering the real CLIs and store `credentials` as the admin's `model` credential profile."""
    runner = Runner(hub.url, hub.admin_token, name="real", slots=2, **PROCESS_MODE, workspace_root=tmp_path / "ws",
                    engines={"claude": ClaudeEngine(), "codex": CodexEngine()})
    hub.runners.append((runner, asyncio.create_task(runner.run_forever())))
    await started(runner.registered.wait(), "the runner to register")
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    await hub.hub.credentials.declare(admin, "model", sorted(credentials))
    for name, value in credentials.items():
        await hub.hub.credentials.set_value(admin, "model", name, value)
    return admin


async def run_task(hub, admin, profile: str, timeout_s: float, **kw) -> tuple[dict, list[str]]:
    sub = await hub.hub.tasks.submit(admin,
                                     SubmitRequest(prompt="say hello", profile=profile, credential_profile="model",
                                                          timeout_s=timeout_s, **kw))
    view = await hub.hub.tasks.wait_terminal(admin, sub["task_id"], timeout_s=timeout_s + 30)
    page = await hub.hub.tasks.events(admin, sub["task_id"])
    return view, [e["text"] for e in page["events"] if e["type"] == "status"]


CLAUDE_QUIET = {"CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_AUTOUPDATER": "1"}


async def test_real_claude_with_the_model_api_unreachable_reports_each_retry_and_names_the_cause(
        hub, tmp_path, engine_host):
    admin = await start(hub, tmp_path, {**CLAUDE_QUIET, "ANTHROPIC_API_KEY": "sk-ant-test-key",
                                        "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{closed_port()}",
                                        "CLAUDE_CODE_MAX_RETRIES": "3"})
    view, statuses = await run_task(hub, admin, "claude", timeout_s=60)
    assert view["status"] == "failed", view
    assert statuses == [f"engine retrying: attempt {n} of 3 (connection error)" for n in (1, 2, 3)]
    assert view["error"].startswith("the model API was unreachable after 3 attempts; "
                                    "check the network and the credential profile (claude: API Error: "), view["error"]
    assert "sk-ant-test-key" not in str(view)


async def test_real_claude_with_a_rejected_key_fails_at_once_with_the_clis_own_message(hub, tmp_path, engine_host):
    api = await RejectingModelApi(should_retry=False).start()
    try:
        admin = await start(hub, tmp_path, {**CLAUDE_QUIET, "ANTHROPIC_API_KEY": "sk-ant-test-key",
                                            "ANTHROPIC_BASE_URL": api.url})
        view, statuses = await run_task(hub, admin, "claude", timeout_s=60)
    finally:
        await api.stop()
    assert (view["status"], view["error"], statuses) == ("failed", "claude: Invalid API key · Fix external API key", [])
    assert api.requests.count(("POST", "/v1/messages")) == 1


async def test_real_claude_retrying_a_rejected_key_is_stopped_at_the_second_rejection(hub, tmp_path, engine_host):
    api = await RejectingModelApi(should_retry=None).start()  # no x-should-retry: the CLI retries a 401 by itself
    try:
        admin = await start(hub, tmp_path, {**CLAUDE_QUIET, "ANTHROPIC_API_KEY": "sk-ant-test-key",
                                            "ANTHROPIC_BASE_URL": api.url})
        view, statuses = await run_task(hub, admin, "claude", timeout_s=60)
    finally:
        await api.stop()
    assert view["status"] == "failed"
    assert view["error"] == ("the model API rejected the credential (HTTP 401) 2 times in a row; fix the credential "
                             "profile")
    assert statuses == [f"engine retrying: attempt {n} of 10 (credential rejected, HTTP 401)" for n in (1, 2)]


async def test_a_real_claude_session_turn_connects_to_the_hubs_mcp_endpoint_with_its_run_token(
        hub, tmp_path, engine_host):
    admin = await start(hub, tmp_path, {**CLAUDE_QUIET, "ANTHROPIC_API_KEY": "sk-ant-test-key",
                                        "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{closed_port()}",
                                        "CLAUDE_CODE_MAX_RETRIES": "0"})
    # a profile whose launches take the model credential: a Session's turns get it like a task's
    await hub.hub.profiles.add(admin, json.dumps({"manifest_version": 2, "name": "claude-model", "engine": "claude",
                                                  "description": "claude with the test model API",
                                                  "credential_profile": "model"}))
    ses = await hub.hub.sessions.create(admin, profile="claude-model")
    turn_id = await hub.hub.sessions.submit_turn(admin, ses["session_id"], "say hello")
    view = await hub.hub.sessions.wait_turn(admin, turn_id, timeout_s=60)
    assert (view["status"], view["error"]) == ("failed",
                                               "claude: API Error: Unable to connect to API (ConnectionRefused)")
    async with hub.hub.db.read() as conn:
        warnings = (await conn.execute(sa.select(task_events.c.payload).where(
            task_events.c.task_id == turn_id, task_events.c.type == "warning"))).scalars().all()
        used = (await conn.execute(sa.select(api_tokens.c.last_used_at).where(
            api_tokens.c.label == f"amux-session:{ses['session_id']}"))).scalars().all()
    assert used and all(used), "the real CLI never presented the turn's run token to /mcp"
    assert not [w for w in warnings if "MCP" in w["text"]], warnings  # its init listed amux as connected


CODEX_OFFLINE = ["-c", ('model_providers.local={name="local", base_url="BASE", env_key="OPENAI_API_KEY", '
                        'wire_api="responses"}'), "-c", "model_provider=local"]


def codex_args(base: str) -> list[str]:
    return [a.replace("BASE", base) for a in CODEX_OFFLINE]


async def test_real_codex_with_the_model_api_unreachable_gives_up_its_endless_network_wait_naming_the_cause(
        hub, tmp_path, engine_host):
    admin = await start(hub, tmp_path, {"OPENAI_API_KEY": "sk-test-key"})
    view, statuses = await run_task(hub, admin, "codex", timeout_s=60,
                                    extra_args=codex_args(f"http://127.0.0.1:{closed_port()}/v1"))
    assert view["status"] == "failed", view
    assert [s.split(" (")[0] for s in statuses] == [f"engine retrying: attempt {n} of 3" for n in (1, 2, 3)], statuses
    assert all("waiting for the network" in s for s in statuses), statuses
    assert view["error"].startswith("the model API was unreachable after 3 attempts; check the network and the "
                                    "credential profile (codex: "), view["error"]


@pytest.mark.parametrize("policy", ["policy-allow", "escalate-to-main"])  # codex exec, and codex app-server
async def test_real_codex_with_a_rejected_key_fails_at_once_with_the_clis_own_message(hub, tmp_path, engine_host,
                                                                                      policy):
    api = await RejectingModelApi(should_retry=None).start()
    try:
        admin = await start(hub, tmp_path, {"OPENAI_API_KEY": "sk-test-key"})
        view, statuses = await run_task(hub, admin, "codex", timeout_s=60, extra_args=codex_args(f"{api.url}/v1"),
                                        permission_policy=policy)
    finally:
        await api.stop()
    assert view["status"] == "failed", view
    assert view["error"].startswith("the model API rejected the credential; fix the credential profile (codex: "
                                    "unexpected status 401 Unauthorized: Incorrect API key provided"), view["error"]
    assert len(statuses) == 2 and api.requests.count(("POST", "/v1/responses")) == 2
