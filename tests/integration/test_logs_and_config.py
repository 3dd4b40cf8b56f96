"""Logs and configuration as an operator meets them (issue 31): `amux up` with JSON logs parsed line by line during a
small journey, access lines in both formats, and `amux config show` in a subprocess."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from tests.helpers import REPO, started_sync

CLEAN = ("AMUX_HOME", "AMUX_HUB_URL", "AMUX_TOKEN", "AMUX_DATABASE_URL", "AMUX_LISTEN", "AMUX_SESSION_ID",
         "AMUX_LOG_LEVEL", "AMUX_LOG__FORMAT", "AMUX_LOG__LEVEL", "AMUX_SECRET_KEY")
SECRET_KEY = "k3y-that-must-never-be-logged-7a1c"
FIELDS = ("time", "level", "logger", "message", "request_id")


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in CLEAN}
    env.update(extra)
    return env


def amux(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hub.cli", *args], cwd=REPO, env=_env(**env), capture_output=True,
                          text=True, timeout=120)


def _json(raw: bytes) -> dict:
    try:
        return json.loads(raw or b"{}")
    except ValueError:
        return {"text": raw.decode(errors="replace")}


class Up:
    """`amux up` in a subprocess, its stderr (the log stream) kept in a file."""

    def __init__(self, home: Path, **env: str) -> None:
        self.err_path = home.parent / "stderr.log"
        self.err = self.err_path.open("w")
        self.proc = subprocess.Popen([sys.executable, "-m", "hub.cli", "up", "--listen", "127.0.0.1:0", "--slots", "1"],
                                     cwd=REPO, env=_env(AMUX_HOME=str(home), **env), stdout=subprocess.PIPE,
                                     stderr=self.err, text=True)
        self.out: list[str] = []
        self.url = ""
        started_sync(self._runner_line, "amux up to start its in-process runner", interval=0)
        self.token = (home / "admin.token").read_text().strip()

    def _runner_line(self) -> bool:
        """Read one line of `amux up`; True once it says its in-process runner started."""
        line = self.proc.stdout.readline()
        if not line:
            raise AssertionError(f"amux up ended: {''.join(self.out)}{self.err_path.read_text()}")
        self.out.append(line)
        if m := re.search(r"listening on (http://\S+)", line):
            self.url = m.group(1)
        return "in-process runner" in line

    def call(self, method: str, path: str, body: dict | None = None, *, token: str | None = None) -> tuple[int, dict]:
        req = urllib.request.Request(self.url + path, method=method, data=json.dumps(body).encode() if body else None,
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {token}"} if token else {})})
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                return resp.status, _json(resp.read())
        except urllib.error.HTTPError as e:
            return e.code, _json(e.read())

    def logged(self, pattern: str, timeout: float = 10) -> None:
        """Wait until stderr has a line matching `pattern` (an access line follows its response by a moment)."""
        deadline = time.monotonic() + timeout
        while not re.search(pattern, self.err_path.read_text(), re.M) and time.monotonic() < deadline:
            time.sleep(0.05)

    def stop(self) -> str:
        """Stop the hub; return everything it wrote to stderr."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.out += self.proc.stdout.readlines()
        self.err.close()
        return self.err_path.read_text()


def test_every_line_of_a_json_journey_is_json_with_its_fields_access_lines_and_no_secret(tmp_path: Path):
    hub = Up(tmp_path / "home", AMUX_LOG__FORMAT="json", AMUX_LOG__LEVEL="INFO", AMUX_SECRET_KEY=SECRET_KEY)
    try:
        assert hub.call("GET", "/healthz")[0] == 200
        assert hub.call("GET", f"/nope?token={hub.token}")[0] == 404  # the query (a token here) is never logged
        assert hub.call("GET", "/api/v1/tasks")[0] == 401
        def submitted() -> tuple[int, dict] | None:  # the in-process runner registers just after that line
            status, sub = hub.call("POST", "/api/v1/tasks", {"prompt": "say hi", "profile": "scripted"},
                                   token=hub.token)
            return None if status == 400 and "no registered runtime" in sub.get("message", "") else (status, sub)

        status, sub = started_sync(submitted, "the in-process runner to register", proc=hub.proc, interval=0.2)
        assert status in (200, 201), sub
        done = False
        for _ in range(20):
            _, page = hub.call("GET", f"/api/v1/tasks/{sub['task_id']}/wait?cursor=0&timeout_s=5", token=hub.token)
            if done := page["done"]:
                break
        assert done
        hub.logged(r'"path": "/api/v1/tasks/[^"]+/wait"')
    finally:
        err = hub.stop()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    records = []
    for ln in lines:
        rec = json.loads(ln)  # every line the hub logs is one JSON object
        assert all(k in rec for k in FIELDS), rec
        records.append(rec)
    access = [r for r in records if r["logger"] == "amux.access"]
    by_path = {(r["method"], r["path"]): r for r in access}
    assert by_path[("GET", "/healthz")]["status"] == 200
    assert by_path[("GET", "/nope")]["status"] == 404
    assert by_path[("POST", "/api/v1/tasks")]["principal"] == "admin"
    assert by_path[("POST", "/api/v1/tasks")]["client"] == "cli"
    assert any(r["path"] == f"/api/v1/tasks/{sub['task_id']}/wait" for r in access)
    for r in access:
        assert re.fullmatch(r"[0-9a-f]{16}", r["request_id"]) and r["duration_ms"] >= 0 and "?" not in r["path"]
    everything = err + "".join(hub.out)
    assert hub.token not in everything and hub.token.rsplit(".", 1)[-1] not in everything
    assert SECRET_KEY not in everything


def test_text_logs_carry_an_access_line_per_request_by_default(tmp_path: Path):
    hub = Up(tmp_path / "home")
    try:
        assert hub.call("GET", "/healthz?probe=1")[0] == 200
        assert hub.call("GET", "/api/v1/tasks", token=hub.token)[0] in (200, 400)
        hub.logged(r"GET /api/v1/tasks .*principal=admin$")
    finally:
        err = hub.stop()
    assert re.search(r" INFO amux\.access: GET /healthz 200 [0-9.]+ms request_id=[0-9a-f]{16}$", err, re.M), err
    assert re.search(r"GET /api/v1/tasks \d{3} [0-9.]+ms request_id=[0-9a-f]{16} principal=admin$", err, re.M), err
    assert "probe=1" not in err and hub.token not in err


def test_config_show_prints_the_effective_configuration_with_sources_and_secrets_masked(tmp_path: Path):
    home = tmp_path / "home"
    home.mkdir()
    (home / "amux.toml").write_text('[hub]\npoll_s = 0.5\n[[feishu.apps]]\napp_id = "cli_show"\n'
                                    'app_secret = "app-secret-value"\nencrypt_key = "encrypt-key-value"\n')
    res = amux("config", "show", "--db", "postgresql://amux:db-password@db:5432/amux", AMUX_HOME=str(home),
               AMUX_SECRET_KEY=SECRET_KEY, AMUX_HUB__HEARTBEAT_S="2", AMUX_LOG_LEVEL="info",
               AMUX_HUB__METRICS_TOKEN="metrics-token-value")
    assert res.returncode == 0, res.stderr
    for secret in (SECRET_KEY, "app-secret-value", "encrypt-key-value", "db-password", "metrics-token-value"):
        assert secret not in res.stdout
    rows = {m.group(1): (m.group(2), m.group(3)) for m in re.finditer(r"^(\S+)\s+= (.*?)  # (.*)$", res.stdout, re.M)}
    assert rows["hub.poll_s"] == ("0.5", f"file {home / 'amux.toml'}")
    assert rows["hub.heartbeat_s"] == ("2.0", "env AMUX_HUB__HEARTBEAT_S")
    assert rows["hub.reservation_ttl_s"] == ("30.0", "default")
    assert rows["database_url"] == ('"postgresql://amux:***@db:5432/amux"', "flag")
    assert rows["secret_key"][0] == rows["hub.metrics_token"][0] == rows["feishu.apps[0].app_secret"][0] == '"***"'
    assert rows["log.level"] == ('"INFO"', "env AMUX_LOG_LEVEL")
    shown = json.loads(amux("config", "show", "--json", AMUX_HOME=str(home)).stdout)
    assert shown["settings"]["feishu.apps[0].encrypt_key"] == {"value": "***", "source": f"file {home / 'amux.toml'}"}


def test_an_unknown_setting_stops_the_start_naming_the_nearest_one(tmp_path: Path):
    home = tmp_path / "home"
    res = amux("up", "--listen", "127.0.0.1:0", AMUX_HOME=str(home), AMUX_HUB__RESERVATON_TTL_S="5")
    assert res.returncode != 0
    assert "AMUX_HUB__RESERVATON_TTL_S" in res.stderr and "did you mean AMUX_HUB__RESERVATION_TTL_S?" in res.stderr
    home.mkdir(exist_ok=True)
    (home / "amux.toml").write_text("[hub]\nreservaton_ttl_s = 5\n")
    res = amux("hub", "serve", "--listen", "127.0.0.1:0", AMUX_HOME=str(home))
    assert res.returncode != 0 and "did you mean hub.reservation_ttl_s?" in res.stderr
