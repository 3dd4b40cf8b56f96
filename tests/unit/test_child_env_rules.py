"""Pure rules of the trust boundary: what a child inherits, what a run token may call, where an engine finds config."""
from __future__ import annotations

import pytest

from hub.engines.claude import ClaudeEngine
from hub.engines.codex import CodexEngine
from hub.engines.environment import base_env, child_env
from hub.runner import protocol as p
from hub.runner.agent import launch_env
from hub.services.auth.service import rest_area, run_token_may

RUNNER = {
    "PATH": "/usr/bin", "HOME": "/root", "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "TERM": "xterm", "TZ": "UTC",
    "USER": "amux", "AMUX_TOKEN": "amux.runner.secret", "AMUX_SECRET_KEY": "k", "AMUX_DATABASE_URL": "postgresql://x",
    "AMUX_HOME": "/srv/amux", "AWS_SECRET_ACCESS_KEY": "aws", "PYTHONPATH": "/srv/src", "SSH_AUTH_SOCK": "/tmp/agent",
}


def test_the_child_environment_allowlist_passes_only_path_home_locale_term_tz_user():
    assert base_env(RUNNER) == {k: RUNNER[k] for k in ("PATH", "HOME", "LANG", "LC_ALL", "TERM", "TZ", "USER")}


def test_the_launchs_own_variables_override_the_allowlist():
    assert child_env({"HOME": "/runs/tr_1", "X": "1"}, RUNNER)["HOME"] == "/runs/tr_1"


def test_a_launch_environment_has_the_runs_home_credentials_and_coordination_but_nothing_else_of_the_runners(tmp_path):
    d = p.Dispatch(task_id="tr_1", attempt=1, prompt="", snapshot={"engine": "scripted"},
                   env={"ANTHROPIC_API_KEY": "cred", "AMUX_TOKEN": "amux.run.tok", "AMUX_HUB_URL": "http://hub"})
    env = launch_env(d, tmp_path / "home", None, RUNNER)
    assert env["HOME"] == str(tmp_path / "home") and env["AMUX_TOKEN"] == "amux.run.tok"
    assert env["ANTHROPIC_API_KEY"] == "cred"
    for leaked in ("AMUX_SECRET_KEY", "AMUX_DATABASE_URL", "AMUX_HOME", "AWS_SECRET_ACCESS_KEY", "PYTHONPATH",
                   "SSH_AUTH_SOCK"):
        assert leaked not in env


def test_an_engine_finds_its_own_config_from_a_per_run_home(tmp_path):
    (tmp_path / ".claude").mkdir()
    assert ClaudeEngine().config_env({"HOME": str(tmp_path)}) == {"CLAUDE_CONFIG_DIR": str(tmp_path / ".claude")}
    assert CodexEngine().config_env({"HOME": str(tmp_path)}) == {}  # no ~/.codex: nothing to point at
    assert CodexEngine().config_env({"HOME": str(tmp_path), "CODEX_HOME": "/etc/codex"}) == {"CODEX_HOME": "/etc/codex"}


@pytest.mark.parametrize(("method", "path", "allowed"), [
    ("GET", "/api/v1/memory", True),             # memory
    ("PUT", "/api/v1/memory/plan", True),
    ("POST", "/api/v1/tasks", True),              # coordination: delegation
    ("GET", "/api/v1/tasks/tr_1/wait", True),
    ("POST", "/api/v1/sessions/ses_1/turns", True),
    ("GET", "/api/v1/turns/turn_1", True),
    ("POST", "/api/v1/schedules", True),
    ("GET", "/api/v1/whoami", True),
    ("GET", "/api/v1/profiles", True),
    ("POST", "/api/v1/profiles", False),          # changing what others run
    ("GET", "/api/v1/tokens", False),             # token management
    ("DELETE", "/api/v1/tokens/tok_1", False),
    ("PUT", "/api/v1/credentials/x/Y", False),    # credentials
    ("GET", "/api/v1/runtimes", False),
    ("DELETE", "/api/v1/runtimes/r1", False),
    ("GET", "/api/v1/memoryx", False),            # a prefix is a path segment, not a string prefix
])
def test_a_run_token_may_make_only_memory_and_coordination_calls(method, path, allowed):
    assert run_token_may(rest_area(path), read=method == "GET") is allowed
