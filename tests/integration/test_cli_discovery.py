"""The CLI finds its hub (DESIGN §7): the real `amux` console script in subprocesses, `amux up` on a real port."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from tests.helpers import started_sync

AMUX = str(Path(sys.executable).parent / "amux")
CLEAN = ("AMUX_HOME", "AMUX_HUB_URL", "AMUX_TOKEN", "AMUX_DATABASE_URL", "AMUX_LISTEN", "AMUX_SESSION_ID")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    env.update(extra)
    return env


def amux(*args: str, cwd: Path, timeout: float = 120, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([AMUX, *args], cwd=cwd, env=_env(**env), capture_output=True, text=True, timeout=timeout)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Up:
    """`amux up` in a subprocess; `url` is what it printed."""

    def __init__(self, home: Path, cwd: Path, *extra: str) -> None:
        self.home = home
        self.proc = subprocess.Popen([AMUX, "up", "--listen", "127.0.0.1:0", "--slots", "2", *extra], cwd=cwd,
                                     env=_env(AMUX_HOME=str(home)), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.lines: list[str] = []
        self.url = ""
        started_sync(self._runner_line, "amux up to start its in-process runner", interval=0)

    def _runner_line(self) -> bool:
        """Read one line of `amux up`; True once it says its in-process runner started."""
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"amux up ended: {''.join(self.lines)}")
        self.lines.append(line)
        m = re.search(r"listening on (http://\S+)", line)
        if m:
            self.url = m.group(1)
        return "in-process runner" in line

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def up(tmp_path: Path):
    started: list[Up] = []

    def start(*extra: str) -> Up:
        u = Up(tmp_path / "home", tmp_path, *extra)
        started.append(u)
        return u
    yield start
    for u in started:
        u.stop()


def test_listen_port_0_reports_and_uses_the_real_port_and_writes_hub_json(up, tmp_path: Path):
    u = up()
    port = int(u.url.rsplit(":", 1)[1])
    assert port != 0, u.lines
    hub_file = json.loads((u.home / "hub.json").read_text())
    assert hub_file == {"url": u.url, "pid": u.proc.pid}
    # The in-process runner got the real port too: a task runs, found through $AMUX_HOME/hub.json alone.
    res = amux("task", "submit", "--profile", "scripted", "--wait", "--json", "say found", cwd=tmp_path,
               AMUX_HOME=str(u.home))
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["result"]["text"] == "found"
    # ...and runs are told the real address too (AMUX_HUB_URL of a task child).
    res = amux("task", "submit", "--profile", "scripted", "--wait", "--json", "env AMUX_HUB_URL", cwd=tmp_path,
               AMUX_HOME=str(u.home))
    assert res.returncode == 0 and json.loads(res.stdout)["result"]["text"] == u.url, res.stdout + res.stderr
    u.stop()
    assert not (u.home / "hub.json").exists(), "a stopped hub removes its address file"


def test_client_uses_the_hub_json_of_its_home_for_feishu_recheck(up, tmp_path: Path):
    u = up()
    res = amux("feishu", "recheck", "--app", "cli_missing", cwd=tmp_path, AMUX_HOME=str(u.home))
    # The hub answered (an unknown app is the hub's refusal, not a connection error).
    assert res.returncode == 3 and "cannot reach" not in res.stderr and "cli_missing" in res.stderr, res.stderr


def test_hub_flag_beats_env_beats_hub_json_beats_default(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "admin.token").write_text("amux.x.y\n")
    p_file, p_env, p_flag = _closed_port(), _closed_port(), _closed_port()
    (home / "hub.json").write_text(json.dumps({"url": f"http://127.0.0.1:{p_file}", "pid": 1}))
    res = amux("task", "list", cwd=tmp_path, AMUX_HOME=str(home))
    assert f"127.0.0.1:{p_file} (from {home / 'hub.json'})" in res.stderr, res.stderr
    res = amux("task", "list", cwd=tmp_path, AMUX_HOME=str(home), AMUX_HUB_URL=f"http://127.0.0.1:{p_env}")
    assert f"127.0.0.1:{p_env} (from AMUX_HUB_URL)" in res.stderr, res.stderr
    res = amux("task", "list", "--hub", f"http://127.0.0.1:{p_flag}", cwd=tmp_path, AMUX_HOME=str(home),
               AMUX_HUB_URL=f"http://127.0.0.1:{p_env}")
    assert f"127.0.0.1:{p_flag} (from --hub)" in res.stderr, res.stderr
    (home / "hub.json").unlink()
    res = amux("task", "list", cwd=tmp_path, AMUX_HOME=str(home))
    assert "127.0.0.1:8787 (from the default" in res.stderr, res.stderr
    for r in (res,):
        assert r.returncode == 4 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr


@pytest.mark.parametrize("argv", [
    ("db", "upgrade"), ("token", "create", "--principal", "p"), ("task", "list"), ("schedule", "list"),
    ("feishu", "recheck", "--app", "cli_x"), ("identity", "list"), ("identity", "link"),
    ("db", "recover-creators"),
])
def test_every_command_with_a_missing_home_answers_one_line_naming_the_fix(argv: tuple[str, ...], tmp_path: Path):
    res = amux(*argv, cwd=tmp_path, AMUX_HOME=str(tmp_path / "nowhere"))
    assert res.returncode == 3, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert "does not exist" in lines[0] and ("amux up" in lines[0] or "AMUX_HOME" in lines[0]), lines[0]
    assert not (tmp_path / "nowhere").exists()


@pytest.mark.parametrize("argv", [("up",), ("db", "upgrade"), ("task", "list"), ("identity", "link")])
def test_every_command_with_an_unreadable_home_answers_one_line_naming_the_fix(argv: tuple[str, ...], tmp_path: Path):
    bad = tmp_path / "a-file"
    bad.write_text("not a directory")
    res = amux(*argv, cwd=tmp_path, AMUX_HOME=str(bad))
    assert res.returncode == 3, (res.stdout, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in res.stderr and "not a directory" in lines[0], res.stderr


def test_an_unreadable_token_file_answers_one_line(tmp_path: Path):
    home = tmp_path / "home"
    (home / "admin.token").mkdir(parents=True)  # unreadable as a file even for root
    res = amux("task", "list", cwd=tmp_path, AMUX_HOME=str(home))
    assert res.returncode == 3 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "admin.token" in res.stderr and "Traceback" not in res.stderr
