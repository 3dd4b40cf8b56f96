"""The CLI a script can trust (issue 31 item 3), each as the real CLI in a subprocess against a live hub:
exit codes, --timeout, a quiet broken pipe, --version, global options, the runner's hub discovery, help,
completion, progress lines and readable tool events."""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import sys
import time
from pathlib import Path

import httpx2

from hub.cli import build_parser
from tests.helpers import REPO, started
from tests.integration.test_cli_discovery import Up
from tests.integration.test_cli_rest import amux


def _env(hub) -> dict[str, str]:  # noqa: ANN001
    return {"AMUX_HUB_URL": hub.url, "AMUX_TOKEN": hub.admin_token}


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def test_exit_codes_ok_ended_usage_refused_unreachable(hub):
    await hub.start_runner()
    env = _env(hub)
    code, out, err = await amux("task", "submit", "--profile", "scripted", "--wait", "say fine", env=env)
    assert code == 0 and "succeeded" in out, err
    code, out, err = await amux("task", "submit", "--profile", "scripted", "--wait", "fail oops", env=env)
    assert code == 1 and "failed" in out and err.strip().endswith("ended failed"), (out, err)
    code, _, err = await amux("task", "frobnicate", env=env)
    assert code == 2 and "invalid choice" in err
    code, _, err = await amux("task", "get", "tr_nothere", env=env)
    assert code == 3 and err.startswith("amux: ") and len(err.strip().splitlines()) == 1, err
    code, _, err = await amux("task", "list", env={**env, "AMUX_HUB_URL": f"http://127.0.0.1:{_closed_port()}"})
    assert code == 4 and "cannot reach the hub" in err and "Traceback" not in err, err
    code, _, err = await amux("session", "send", env={**env, "AMUX_SESSION_ID": ""}, stdin=b"hello")
    assert code == 2 and "no session-ref" in err  # a usage error found after parsing


async def test_task_wait_timeout_is_honoured_and_exits_5(hub):
    await hub.start_runner()
    env = _env(hub)
    code, out, err = await amux("task", "submit", "--profile", "scripted", "sleep 20", env=env)
    tid = out.strip()
    started = time.monotonic()
    code, out, err = await amux("task", "wait", tid, "--timeout", "2", env=env)
    took = time.monotonic() - started
    assert code == 5 and "running" in out and "goes on" in err, (code, out, err)
    assert took < 8, f"--timeout 2 blocked {took:.1f}s"
    await amux("task", "cancel", tid, env=env)


async def test_a_closed_stdout_is_quiet(hub):
    env = {**os.environ, **_env(hub)}
    read, write = os.pipe()
    os.close(read)
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "hub.cli", "task", "list", cwd=REPO, env=env,
                                                stdout=write, stderr=asyncio.subprocess.PIPE)
    os.close(write)
    _, err = await proc.communicate()
    assert proc.returncode == 141 and err.decode() == "", err.decode()


async def test_version_and_global_options_before_the_subcommand(hub, tmp_path: Path):
    code, out, _ = await amux("--version")
    assert code == 0 and out.startswith("amux ")
    clean = {"AMUX_HUB_URL": "", "AMUX_TOKEN": "", "AMUX_HOME": str(tmp_path / "nowhere")}
    code, out, err = await amux("--hub", hub.url, "--token", hub.admin_token, "task", "list", "--json", env=clean)
    assert code == 0 and "tasks" in json.loads(out), err
    # --home before the subcommand: its hub.json and admin.token find the hub
    home = tmp_path / "home"
    home.mkdir()
    (home / "hub.json").write_text(json.dumps({"url": hub.url, "pid": 1}))
    (home / "admin.token").write_text(hub.admin_token + "\n")
    code, out, err = await amux("--home", str(home), "runtime", "list", "--json", env=clean)
    assert code == 0 and "runtimes" in json.loads(out), err
    code, out, err = await amux("runtime", "list", "--home", str(home), "--json", env=clean)
    assert code == 0, err
    # a subcommand's own --hub wins over the global one
    code, _, err = await amux("--hub", hub.url, "task", "list", "--hub", f"http://127.0.0.1:{_closed_port()}",
                              "--token", hub.admin_token, env=clean)
    assert code == 4 and "(from --hub)" in err


async def _runtimes(hub) -> set[str]:  # noqa: ANN001
    async with httpx2.AsyncClient() as http:
        res = await http.get(f"{hub.url}/api/v1/runtimes", headers={"Authorization": f"Bearer {hub.admin_token}"})
        return {r["name"] for r in res.json()["runtimes"] if r["status"] == "online"}


async def test_amux_runner_finds_the_hub_from_amux_hub_url_or_hub_json(hub, tmp_path: Path):
    token = await hub.hub.auth.create_token("ops", label="runner", admin=True, runner=True)
    home = tmp_path / "home"
    home.mkdir()
    (home / "hub.json").write_text(json.dumps({"url": hub.url, "pid": 1}))
    for name, extra in (("via-env", {"AMUX_HUB_URL": hub.url}), ("via-home", {"AMUX_HOME": str(home)})):
        env = {**os.environ, "AMUX_TOKEN": token, "AMUX_HUB_URL": "", **extra}
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "hub.cli", "runner", "--name", name, "--slots", "1",
            "--workspace-root", str(tmp_path / name), cwd=REPO, env=env,
            stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.PIPE)
        try:
            await started(lambda n=name: _has(hub, n), f"runner {name}", proc=proc)
        finally:
            proc.terminate()
            await asyncio.wait_for(proc.wait(), 30)


async def _has(hub, name: str) -> bool:  # noqa: ANN001
    return name in await _runtimes(hub)


def test_every_option_and_subcommand_has_help_and_no_meaningless_listen():
    missing = []

    def walk(p: argparse.ArgumentParser, path: list[str]) -> None:
        for a in p._actions:
            if isinstance(a, argparse._SubParsersAction):
                helps = {c.dest: c.help for c in a._choices_actions}
                for name, sp in a.choices.items():
                    if not helps.get(name):
                        missing.append(" ".join([*path, name]))
                    walk(sp, [*path, name])
            elif not a.help:
                missing.append(f"{' '.join(path)} {a.option_strings or a.dest}")
    walk(build_parser(), ["amux"])
    assert not missing, missing


async def test_help_reads_naturally_and_db_upgrade_token_create_take_no_listen():
    code, out, _ = await amux("task", "--help")
    assert code == 0 and "follow a task's events" in out and "wait a task" not in out
    code, out, _ = await amux("schedule", "--help")
    assert "history a schedule" not in out and "firings" in out
    code, out, _ = await amux("runner", "--help")
    assert "--workspace-root" in out and "hub.json" in out
    for argv in (("db", "upgrade"), ("token", "create", "--principal", "p"), ("db", "recover-creators")):
        code, _, err = await amux(*argv, "--listen", "127.0.0.1:1")
        assert code == 2 and "unrecognized arguments: --listen" in err, (argv, err)


async def test_shell_completion_answers_from_the_parser(tmp_path: Path):
    out = tmp_path / "completions"
    line = "amux ta"
    code, _, err = await amux(env={"_ARGCOMPLETE": "1", "COMP_LINE": line, "COMP_POINT": str(len(line)),
                                   "_ARGCOMPLETE_IFS": "\n", "_ARGCOMPLETE_STDOUT_FILENAME": str(out)})
    assert code == 0, err
    assert set(out.read_text().split()) == {"task"}, out.read_text()


async def test_tool_events_print_as_lines_and_session_send_says_what_it_waits_for(hub):
    await hub.start_runner()
    env = _env(hub)
    script = "say looking\ntool Read README.md\nusage input=3 output=4"
    code, out, err = await amux("task", "submit", "--profile", "scripted", "--wait", script, env=env)
    assert code == 0, err
    assert "tool: Read README.md (completed)" in out and "usage: input_tokens=3 output_tokens=4" in out, out
    assert "{'" not in out
    code, out, err = await amux("session", "create", "--name", "desk", "--profile", "scripted", env=env)
    assert code == 0, err
    code, out, err = await amux("session", "send", "desk", "sleep 1.5\nsay done", env=env)
    assert code == 0 and out.strip() == "done", (out, err)
    lines = err.strip().splitlines()
    assert "queued in session" in lines[0] and "succeeded after" in lines[-1], err
    code, out, err = await amux("session", "send", "desk", "sleep 10", "--timeout", "1", env=env)
    assert code == 5 and "running" in out and "goes on" in err, (code, out, err)


def test_amux_up_says_before_and_after_it_migrates(tmp_path: Path):
    u = Up(tmp_path / "home", tmp_path)
    try:
        text = "".join(u.lines)
        before, after, listening = (text.find(s) for s in ("applying database migrations", "database at head",
                                                           "listening on"))
        assert 0 <= before < after < listening, text
    finally:
        u.stop()


async def test_instance_list_shows_your_instances_newest_first_archived_ones_only_when_asked(hub):
    await hub.start_runner()
    env = _env(hub)
    ids = []
    for name in ("first", "second"):
        code, out, err = await amux("instance", "create", "--profile", "scripted", "--name", name, "--json", env=env)
        assert code == 0, err
        ids.append(json.loads(out)["instance_id"])
    code, out, err = await amux("instance", "archive", ids[0], env=env)
    assert code == 0, err
    code, out, err = await amux("instance", "list", "--json", env=env)
    assert code == 0, err
    assert [i["instance_id"] for i in json.loads(out)["instances"]] == [ids[1]]
    code, out, err = await amux("instance", "list", "--archived", "--json", env=env)
    assert [i["instance_id"] for i in json.loads(out)["instances"]] == [ids[1], ids[0]]
    code, out, err = await amux("instance", "list", env=env)
    assert code == 0 and ids[1] in out and ids[0] not in out, out
    code, _, err = await amux("instance", "list", "--limit", "500", env=env)
    assert code == 3 and "200" in err, err  # refused naming the maximum, never cut short
    other = await hub.token("somebody-else")
    code, out, err = await amux("instance", "list", "--json", env={**env, "AMUX_TOKEN": other})
    assert code == 0 and json.loads(out)["instances"] == []  # only your own
