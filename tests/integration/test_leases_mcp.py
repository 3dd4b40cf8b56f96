"""Lease tasks and boxes through the official MCP SDK client over HTTP, with real processes in local boxes."""
from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from hub.domain import leases as rules
from tests.helpers import mcp_client, start_hub
from tests.integration.test_box_escape import box_hub, destroy_live_boxes

LEASE_TOOLS = {"rift_task_new", "rift_task_list", "rift_task_attach", "rift_task_release", "rift_task_close",
               "rift_vm_new", "rift_vm_list", "rift_vm_exec", "rift_vm_destroy"}


async def ok(client, tool: str, args: dict[str, Any] | None = None) -> dict[str, Any]:  # noqa: ANN001
    """Call a tool and return its structured result, failing the test on a tool error."""
    res = await client.call_tool(tool, args or {})
    assert not res.is_error, f"{tool}: {res.content[0].text}"
    return res.structured_content


async def refused(client, tool: str, args: dict[str, Any] | None = None) -> str:  # noqa: ANN001
    """Call a tool that must be refused and return our refusal text (after the SDK's `Error executing tool X: `)."""
    res = await client.call_tool(tool, args or {})
    assert res.is_error, f"{tool} was not refused: {res.structured_content}"
    text = res.content[0].text
    prefix = f"Error executing tool {tool}: "
    assert text.startswith(prefix), text[:300]
    return text[len(prefix):]


def running(pid: int) -> bool:
    """Return whether a process runs (a zombie waiting for its reaper does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def alive(pid: int, settle_s: float = 2.0) -> bool:
    """Return whether a process still runs once a kill has had `settle_s` to land (SIGKILL is asynchronous)."""
    import time

    deadline = time.monotonic() + settle_s
    while running(pid) and time.monotonic() < deadline:
        time.sleep(0.01)
    return running(pid)


@pytest.fixture
async def hub(sqlite_url, tmp_path, clock):  # noqa: ANN001, ANN201
    """A hub on a real port over SQLite; the boxes a test leaves are destroyed (they outlive a stopped hub)."""
    handle = await start_hub(sqlite_url, tmp_path, clock)
    yield handle
    await destroy_live_boxes(handle.hub)
    await handle.stop()


async def box_pids(hub, vm_id: str) -> list[int]:  # noqa: ANN001
    """Return the host pids of every process in a box (its PID namespace), seen from outside."""
    import sqlalchemy as sa

    from hub.store.tables import boxes

    async with hub.hub.db.read() as conn:
        handle = (await conn.execute(sa.select(boxes.c.handle).where(boxes.c.id == vm_id))).scalar_one()
    ns = os.readlink(f"/proc/{handle['init_pid']}/ns/pid")
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if os.readlink(f"/proc/{entry.name}/ns/pid") == ns:
                    found.append(int(entry.name))
    return found


@contextlib.asynccontextmanager
async def two_agents(hub):  # noqa: ANN001, ANN201
    """Connect two MCP clients of one user, each on its own unlabeled token: `Claude` and `Codex`.

    (Not a fixture: the SDK client's task group must be left by the task that entered it.)
    """
    t1, t2 = await hub.token("alice"), await hub.token("alice")
    async with mcp_client(hub.url, t1, name="Claude") as claude, mcp_client(hub.url, t2, name="Codex") as codex:
        yield claude, codex


async def test_the_lease_tools_are_served_with_their_seed_names(hub):
    async with mcp_client(hub.url, await hub.token("alice")) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
    assert LEASE_TOOLS <= set(tools)
    assert set(tools["rift_vm_exec"].input_schema["properties"]) == {"task", "vm_id", "command", "timeout_s"}
    assert set(tools["rift_task_attach"].input_schema["properties"]) == {"task_id", "takeover"}
    assert tools["rift_task_new"].output_schema is not None


async def test_the_holder_shown_is_mcp_plus_the_name_the_client_declared(hub):
    async with two_agents(hub) as (claude, codex):
        t = await ok(claude, "rift_task_new", {"name": "fix login"})
        assert t["holder"] == "mcp:Claude" and t["handle"].startswith(t["task_id"] + ".")
        listed = (await ok(codex, "rift_task_list"))["tasks"]
        assert [(x["task_id"], x["holder"], x["status"]) for x in listed] == [(t["task_id"], "mcp:Claude", "open")]
        assert all("handle" not in x for x in listed)


async def test_a_handle_that_is_not_the_current_lease_says_who_holds_it_since_when(hub, clock):
    async with two_agents(hub) as (claude, codex):
        t = await ok(claude, "rift_task_new", {"name": "work"})
        clock.advance(minutes=2)
        text = await refused(codex, "rift_task_attach", {"task_id": t["task_id"]})
        assert "held by mcp:Claude since 2026-01-05T09:00:00Z" in text
        assert "takeover=true" in text and "tell the user" in text
        taken = await ok(codex, "rift_task_attach", {"task_id": t["task_id"], "takeover": True})
        assert taken["holder"] == "mcp:Codex" and taken["previous_holder"] == "mcp:Claude"
        text = await refused(claude, "rift_vm_list", {"task": t["handle"]})
        assert text == ("held by mcp:Codex since 2026-01-05T09:02:00Z; "
                        "`rift_task_attach` with takeover takes it over — tell the user")


async def test_every_refusal_names_the_tool_that_mends_it(hub):
    async with two_agents(hub) as (claude, _):
        assert await refused(claude, "rift_vm_list", {}) == rules.NO_HANDLE
        assert await refused(claude, "rift_vm_new", {"task": ""}) == rules.NO_HANDLE
        assert "rift_task_new opens one" in rules.NO_HANDLE.replace("`", "")
        missing = await refused(claude, "rift_vm_list", {"task": "task_zzzzzzzz.secret"})
        assert missing == rules.not_yours("task_zzzzzzzz")
        released = await ok(claude, "rift_task_new", {"name": "released"})
        await ok(claude, "rift_task_release", {"task": released["handle"]})
        assert await refused(claude, "rift_vm_new", {"task": released["handle"]}) == rules.released(released["task_id"])
        closed = await ok(claude, "rift_task_new", {"name": "closed"})
        await ok(claude, "rift_task_close", {"task": closed["handle"]})
        text = await refused(claude, "rift_vm_list", {"task": closed["handle"]})
        assert text == (f"task {closed['task_id']} is closed (closed by mcp:Claude); its VMs are gone; "
                        "`rift_task_new` opens another")
        assert "rift_task_new opens another" in (await refused(claude, "rift_task_attach",
                                                               {"task_id": closed["task_id"]})).replace("`", "")


async def test_another_users_task_id_is_refused_as_not_yours(hub):
    async with two_agents(hub) as (claude, _):
        t = await ok(claude, "rift_task_new", {"name": "alice's"})
        async with mcp_client(hub.url, await hub.token("bob"), name="Claude") as bob:
            assert await refused(bob, "rift_task_attach", {"task_id": t["task_id"],
                                                           "takeover": True}) == rules.not_yours(t["task_id"])
            assert await refused(bob, "rift_vm_new", {"task": t["handle"]}) == rules.not_yours(t["task_id"])
            assert (await ok(bob, "rift_task_list"))["tasks"] == []
        assert (await ok(claude, "rift_vm_list", {"task": t["handle"]}))["boxes"] == []


async def test_one_user_holds_at_most_max_open_tasks_and_closing_one_makes_room(sqlite_url, tmp_path):
    async with box_hub(sqlite_url, tmp_path / "home", leases={"max_open_tasks_per_principal": 2}) as h:
        async with mcp_client(h["url"], await h["hub"].auth.create_token("alice"), name="Claude") as alice:
            first = await ok(alice, "rift_task_new", {"name": "one"})
            await ok(alice, "rift_task_new", {"name": "two"})
            text = await refused(alice, "rift_task_new", {"name": "three"})
            assert text == rules.too_many_open_tasks(2, 2)
            assert "leases.max_open_tasks_per_principal = 2" in text and "`rift_task_close`" in text
            assert "ask the operator to raise the setting" in text
            released = await ok(alice, "rift_task_release", {"task": first["handle"]})  # released is still open
            assert released["status"] == "open" and (await refused(alice, "rift_task_new", {"name": "three"}))
            taken = await ok(alice, "rift_task_attach", {"task_id": first["task_id"]})
            await ok(alice, "rift_task_close", {"task": taken["handle"]})
            await ok(alice, "rift_task_new", {"name": "three"})
        async with mcp_client(h["url"], await h["hub"].auth.create_token("bob"), name="Claude") as bob:
            await ok(bob, "rift_task_new", {"name": "bob's own count"})
        async with mcp_client(h["url"], h["admin"], name="Claude") as admin:  # admin tokens are exempt
            for n in range(3):
                await ok(admin, "rift_task_new", {"name": f"admin {n}"})


async def test_one_user_holds_at_most_max_live_boxes_across_all_tasks_and_destroying_one_makes_room(sqlite_url,
                                                                                                     tmp_path):
    async with box_hub(sqlite_url, tmp_path / "home", max_live_per_principal=2) as h:
        async with mcp_client(h["url"], await h["hub"].auth.create_token("alice"), name="Claude") as alice:
            one = (await ok(alice, "rift_task_new", {"name": "one"}))["handle"]
            two = (await ok(alice, "rift_task_new", {"name": "two"}))["handle"]
            first = await ok(alice, "rift_vm_new", {"task": one})
            await ok(alice, "rift_vm_new", {"task": two})
            text = await refused(alice, "rift_vm_new", {"task": two})
            assert text == rules.too_many_live_boxes(2, 2)
            assert "boxes.max_live_per_principal = 2" in text and "`rift_vm_destroy`" in text
            assert "`rift_task_close`" in text and "ask the operator to raise the setting" in text
            await ok(alice, "rift_vm_destroy", {"task": one, "vm_id": first["vm_id"]})
            await ok(alice, "rift_vm_new", {"task": two})
        async with mcp_client(h["url"], h["admin"], name="Claude") as admin:  # admin tokens are exempt
            task = (await ok(admin, "rift_task_new", {"name": "admin"}))["handle"]
            for _ in range(3):
                await ok(admin, "rift_vm_new", {"task": task})


async def test_by_default_a_task_holds_any_number_of_boxes(sqlite_url, tmp_path):
    async with box_hub(sqlite_url, tmp_path / "home", driver="unsandboxed", max_live_per_principal=0) as h:
        async with mcp_client(h["url"], await h["hub"].auth.create_token("alice"), name="Claude") as alice:
            task = (await ok(alice, "rift_task_new", {"name": "many"}))["handle"]
            for _ in range(40):  # past the old cap of 32
                await ok(alice, "rift_vm_new", {"task": task})
            assert len((await ok(alice, "rift_vm_list", {"task": task}))["boxes"]) == 40


@pytest.mark.parametrize("handle", [
    "task_k3v9q2mx",                    # no dot
    "job_k3v9q2mx.secret",              # wrong prefix
    "task_k3v9q2mx.",                   # empty secret
    "task_k3v9q2mx." + "J" * 10_240,    # 10 KB of junk
    "<script>" * 1300,
], ids=["no-dot", "wrong-prefix", "empty-secret", "10kb-junk", "markup-junk"])
async def test_a_malformed_handle_is_refused_clearly_without_echoing_it(hub, handle):
    async with mcp_client(hub.url, await hub.token("alice"), name="Claude") as c:
        text = await refused(c, "rift_vm_exec", {"task": handle, "vm_id": "vm_abc", "command": "true"})
    assert text == rules.MALFORMED and "JJJJ" not in text and "<script>" not in text


async def test_handing_a_task_over_walks_release_attach_takeover(hub):
    async with two_agents(hub) as (claude, codex):
        t = await ok(claude, "rift_task_new", {"name": "hand over"})
        box = await ok(claude, "rift_vm_new", {"task": t["handle"], "name": "web"})
        # release → the other agent attaches without asking, and the boxes come with the task.
        await ok(claude, "rift_task_release", {"task": t["handle"]})
        got = await ok(codex, "rift_task_attach", {"task_id": t["task_id"]})
        assert got["holder"] == "mcp:Codex" and got["took_over"] is False and got["boxes"] == [box["vm_id"]]
        assert await refused(claude, "rift_vm_list", {"task": t["handle"]}) == rules.held_by("mcp:Codex",
                                                                                             _parse(got["attached_at"]))
        # takeover → the first agent takes it back while the other was active.
        back = await ok(claude, "rift_task_attach", {"task_id": t["task_id"], "takeover": True})
        assert back["took_over"] and back["previous_holder"] == "mcp:Codex"
        assert (await ok(claude, "rift_vm_list", {"task": back["handle"]}))["boxes"][0]["vm_id"] == box["vm_id"]


def _parse(iso: str):  # noqa: ANN202
    from datetime import datetime
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


async def test_twenty_concurrent_takeovers_leave_exactly_one_working_handle(any_hub):
    t1, t2 = await any_hub.token("alice"), await any_hub.token("alice")
    async with mcp_client(any_hub.url, t1, name="Claude") as claude, mcp_client(any_hub.url, t2, name="Codex") as codex:
        t = await ok(claude, "rift_task_new", {"name": "contested"})
        results = await asyncio.gather(*(
            (claude if i % 2 else codex).call_tool("rift_task_attach", {"task_id": t["task_id"], "takeover": True})
            for i in range(20)))
        assert not any(r.is_error for r in results)
        handles = [r.structured_content["handle"] for r in results] + [t["handle"]]
        checks = await asyncio.gather(*(claude.call_tool("rift_vm_list", {"task": h}) for h in handles))
    working = [h for h, r in zip(handles, checks) if not r.is_error]
    assert len(working) == 1
    assert all(r.content[0].text.startswith("Error executing tool rift_vm_list: held by mcp:")
               for r in checks if r.is_error)


async def test_exec_runs_a_real_process_in_the_boxs_own_directory_and_returns_the_exit_code(hub):
    async with two_agents(hub) as (claude, _):
        t = await ok(claude, "rift_task_new", {"name": "exec"})
        box = await ok(claude, "rift_vm_new", {"task": t["handle"], "name": "b1"})
        other = await ok(claude, "rift_vm_new", {"task": t["handle"], "name": "b2"})
        r = await ok(claude, "rift_vm_exec", {"task": t["handle"], "vm_id": box["vm_id"],
                                              "command": "echo hello > f.txt; cat f.txt; pwd; echo oops >&2; exit 3"})
        assert r["exit_code"] == 3 and r["stderr"] == "oops\n" and not r["timed_out"]
        assert r["stdout"].splitlines() == ["hello", "/box"]
        r2 = await ok(claude, "rift_vm_exec", {"task": t["handle"], "vm_id": other["vm_id"],
                                               "command": "ls; echo $AMUX_BOX_ID"})
        assert r2["stdout"] == other["vm_id"] + "\n"  # each box has its own filesystem


async def test_a_box_sees_no_hub_secrets(hub):
    async with two_agents(hub) as (claude, _):
        t = await ok(claude, "rift_task_new", {"name": "peek"})
        box = await ok(claude, "rift_vm_new", {"task": t["handle"]})
        r = await ok(claude, "rift_vm_exec", {"task": t["handle"], "vm_id": box["vm_id"], "command": "env"})
        names = {line.split("=", 1)[0] for line in r["stdout"].splitlines()}
        assert names <= {"PATH", "HOME", "LANG", "TERM", "AMUX_BOX_ID", "AMUX_EXEC_ID", "PWD", "SHLVL", "_"}
        assert box["sandbox"] == "bwrap" and box["sandboxed"] and box["warning"] is None
        home = Path(hub.hub.settings.home).resolve()
        r = await ok(claude, "rift_vm_exec", {"task": t["handle"], "vm_id": box["vm_id"],
                                              "command": f"ls -A {home}; cat {home}/amux.db | wc -c; touch /etc/x"})
        assert "amux.db" not in r["stdout"] and r["exit_code"] != 0


async def test_destroy_kills_every_process_of_the_box_and_removes_it(hub):
    async with two_agents(hub) as (claude, _):
        t = await ok(claude, "rift_task_new", {"name": "destroy"})
        box = await ok(claude, "rift_vm_new", {"task": t["handle"]})
        r = await ok(claude, "rift_vm_exec", {"task": t["handle"], "vm_id": box["vm_id"], "command":
                                              "sleep 600 >/dev/null 2>&1 & echo $!; "
                                              "setsid sh -c 'sleep 601 >/dev/null 2>&1 & echo $!' </dev/null"})
        assert len(r["stdout"].split()) == 2
        pids = await box_pids(hub, box["vm_id"])
        assert len(pids) >= 4 and all(alive(p) for p in pids)  # bwrap init, its sleep, and the two sleeps
        gone = await ok(claude, "rift_vm_destroy", {"task": t["handle"], "vm_id": box["vm_id"]})
        assert gone["state"] == "destroyed"
        assert not any(alive(p) for p in pids)
        assert (await ok(claude, "rift_vm_list", {"task": t["handle"]}))["boxes"] == []
        text = await refused(claude, "rift_vm_exec", {"task": t["handle"], "vm_id": box["vm_id"], "command": "true"})
        assert text == rules.box_not_in_task(box["vm_id"], t["task_id"])


async def test_a_command_that_never_ends_is_killed_at_the_timeout_and_the_box_stays_usable(hub):
    async with two_agents(hub) as (claude, _):
        t = await ok(claude, "rift_task_new", {"name": "hang"})
        box = await ok(claude, "rift_vm_new", {"task": t["handle"]})
        r = await ok(claude, "rift_vm_exec", {"task": t["handle"], "vm_id": box["vm_id"],
                                              "command": "echo $$; exec sleep 600", "timeout_s": 1})
        assert r["timed_out"] and r["exit_code"] is None and "still usable" in r["note"]
        again = await ok(claude, "rift_vm_exec", {"task": t["handle"], "vm_id": box["vm_id"],
                                                  # a zombie (killed, not yet reaped by the box's init) has no cmdline
                                                  "command": f"grep -qs sleep /proc/{r['stdout'].strip()}/cmdline "
                                                             "|| echo fine"})
        assert again["stdout"] == "fine\n" and again["exit_code"] == 0


async def test_flooding_output_is_capped_and_says_it_was_truncated(hub):
    async with two_agents(hub) as (claude, _):
        t = await ok(claude, "rift_task_new", {"name": "flood"})
        box = await ok(claude, "rift_vm_new", {"task": t["handle"]})
        r = await ok(claude, "rift_vm_exec", {"task": t["handle"], "vm_id": box["vm_id"],
                                              "command": "head -c 5000000 /dev/zero | tr '\\0' x; echo done >&2"})
        assert r["exit_code"] == 0 and len(r["stdout"]) == 64 * 1024
        assert r["stdout_truncated"] and r["stderr"] == "done\n"
        assert "truncated" in r["note"]
        r = await ok(claude, "rift_vm_exec", {"task": t["handle"], "vm_id": box["vm_id"], "command": "yes",
                                              "timeout_s": 1})
        assert r["timed_out"] and len(r["stdout"]) == 64 * 1024 and r["stdout_truncated"]
        assert (await ok(claude, "rift_vm_exec", {"task": t["handle"], "vm_id": box["vm_id"],
                                                  "command": "echo ok"}))["stdout"] == "ok\n"


@pytest.mark.parametrize("args, fix", [
    ({"vm_id": "vm_nope", "command": "true"}, "rift_vm_list"),
    ({"vm_id": "../../etc", "command": "true"}, "rift_vm_list"),
    ({"vm_id": "BOX", "command": ""}, "pass a shell command"),
    ({"vm_id": "BOX", "command": "true", "timeout_s": 0}, "timeout_s must be between"),
    ({"vm_id": "BOX", "command": "true", "timeout_s": 10_000}, "timeout_s must be between"),
], ids=["unknown-box", "path-box", "empty-command", "zero-timeout", "huge-timeout"])
async def test_bad_exec_arguments_are_refused_with_the_fix(hub, args, fix):
    async with two_agents(hub) as (claude, _):
        t = await ok(claude, "rift_task_new", {"name": "bad"})
        box = await ok(claude, "rift_vm_new", {"task": t["handle"]})
        args = {**args, "vm_id": box["vm_id"] if args["vm_id"] == "BOX" else args["vm_id"], "task": t["handle"]}
        assert fix in await refused(claude, "rift_vm_exec", args)


async def test_closing_a_task_destroys_its_boxes_and_kills_their_processes(hub):
    async with two_agents(hub) as (claude, _):
        t = await ok(claude, "rift_task_new", {"name": "close"})
        pids = []
        for _ in range(2):
            box = await ok(claude, "rift_vm_new", {"task": t["handle"]})
            await ok(claude, "rift_vm_exec", {"task": t["handle"], "vm_id": box["vm_id"],
                                              "command": "sleep 600 >/dev/null 2>&1 & echo $!"})
            pids += await box_pids(hub, box["vm_id"])
        assert all(alive(p) for p in pids)
        closed = await ok(claude, "rift_task_close", {"task": t["handle"]})
        assert closed["status"] == "closed" and len(closed["destroyed"]) == 2
        assert not any(alive(p) for p in pids)


async def test_a_task_quiet_for_4_hours_closes_itself_and_its_processes_are_killed(hub, clock):
    async with two_agents(hub) as (claude, _):
        t = await ok(claude, "rift_task_new", {"name": "forgotten"})
        box = await ok(claude, "rift_vm_new", {"task": t["handle"]})
        await ok(claude, "rift_vm_exec", {"task": t["handle"], "vm_id": box["vm_id"],
                                          "command": "sleep 600 >/dev/null 2>&1 & echo $!"})
        pids = await box_pids(hub, box["vm_id"])
        clock.advance(hours=4)
        assert await hub.hub.leases.reap_once() == {"closed": 1, "destroyed": 1}
        assert not any(alive(p) for p in pids)
        listed = {x["task_id"]: x for x in (await ok(claude, "rift_task_list"))["tasks"]}
        assert listed[t["task_id"]]["status"] == "closed"
        assert listed[t["task_id"]]["closed_reason"] == "quiet for 4 h"
        assert "its VMs are gone" in await refused(claude, "rift_vm_list", {"task": t["handle"]})


# --- the local driver itself, sandboxed and (by the operator's choice) unsandboxed ----------------------

@pytest.fixture(params=["unsandboxed", pytest.param("local", marks=pytest.mark.skipif(
    shutil.which("bwrap") is None, reason="install bubblewrap (make test does: apt-get install -y bubblewrap)"))])
async def driver(request, tmp_path):  # noqa: ANN001, ANN201
    """A LocalBoxDriver for each `boxes.driver` value."""
    from hub.boxes.local import LocalBoxDriver
    from hub.config import BoxSettings

    return LocalBoxDriver(tmp_path / "boxes", BoxSettings(driver=request.param), hide=[tmp_path])


async def test_the_local_driver_keeps_a_box_usable_after_a_timeout_and_destroy_kills_escaped_processes(driver,
                                                                                                       tmp_path):
    (tmp_path / "secret.token").write_text("hub secret")
    handle = await driver.create("vm_drivertest1")
    assert (await driver.describe(handle)).alive
    r = await driver.exec(handle, "echo $$; exec sleep 600", 0.5)
    assert r.timed_out
    r = await driver.exec(handle, "setsid sh -c 'sleep 602 >/dev/null 2>&1 & echo $!' </dev/null; "
                                  f"cat {tmp_path}/secret.token", 5)
    assert ("hub secret" in r.stdout) is (handle["sandbox"] == "none")
    info = await driver.describe(handle)
    assert info.details["processes"] >= 1
    pids = ([int(r.stdout.split()[0])] if handle["sandbox"] == "none"
            else [int(p) for p in os.listdir("/proc") if p.isdigit() and _same_pidns(int(p), handle["init_pid"])
                  and running(int(p))])
    assert pids and all(running(p) for p in pids)
    await driver.destroy(handle)
    assert not any(alive(p) for p in pids) and not Path(handle["dir"]).exists()
    await driver.destroy(handle)  # idempotent
    assert not (await driver.describe(handle)).alive


def _same_pidns(pid: int, init_pid: int) -> bool:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid") == os.readlink(f"/proc/{init_pid}/ns/pid")
    except OSError:
        return False


async def test_the_local_driver_leaves_a_box_on_another_machine_to_the_replica_there(tmp_path):
    from hub.boxes.base import BoxError
    from hub.boxes.local import LocalBoxDriver
    from hub.config import BoxSettings

    driver = LocalBoxDriver(tmp_path / "boxes", BoxSettings(driver="unsandboxed"))
    elsewhere = {"box_id": "vm_elsewhere1", "dir": "/nowhere", "sandbox": "none", "host": "other-machine"}
    for action in (driver.destroy(elsewhere), driver.exec(elsewhere, "true", 5)):
        with pytest.raises(BoxError, match="lives on host other-machine"):
            await action
    # A box directory that is here is served here, whatever name the machine had when it was made.
    here = {**await driver.create("vm_renamedhost"), "host": "old-name"}
    assert (await driver.exec(here, "echo ok", 5)).stdout == "ok\n"
    await driver.destroy(here)
    await driver.destroy({**here, "host": driver.host})  # gone, on this machine: a no-op


async def test_each_stored_box_is_served_by_the_driver_its_handle_names_whatever_boxes_driver_says_now(tmp_path):
    from hub.boxes.base import BoxError
    from hub.boxes.local import NO_SANDBOX_RECORD, LocalBoxDriver
    from hub.config import BoxSettings

    before = LocalBoxDriver(tmp_path / "boxes", BoxSettings(driver="unsandboxed"), hide=[tmp_path])
    plain = await before.create("vm_madeplain1")
    now = LocalBoxDriver(tmp_path / "boxes", BoxSettings(driver="local"), hide=[tmp_path])  # the operator switched
    assert now.name == "local" and now.sandboxed and not before.sandboxed
    assert (await now.exec(plain, "echo $AMUX_BOX_ID", 5)).stdout == "vm_madeplain1\n"
    assert await now.alive(plain) is True and (await now.describe(plain)).alive
    unrecorded = {k: v for k, v in plain.items() if k != "sandbox"}  # a handle without its sandbox record
    with pytest.raises(BoxError) as e:
        await now.exec(unrecorded, "true", 5)
    assert str(e.value) == NO_SANDBOX_RECORD.format(box_id="vm_madeplain1")
    assert await now.alive(unrecorded) is False
    await now.destroy(plain)
    assert not Path(plain["dir"]).exists() and await now.alive(plain) is False
