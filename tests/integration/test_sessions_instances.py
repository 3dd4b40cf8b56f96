"""Sessions, Turns and Agent Instances over the official MCP client, REST and the CLI."""
from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest
import sqlalchemy as sa

from hub.services.tasks.service import SubmitRequest
from hub.store.tables import instances, mailbox, sessions, task_runs
from tests.helpers import REPO, eventually, mcp_client, turn_child_env


async def call(c, tool, **args):
    res = await c.call_tool(tool, args)
    return res


async def ok(c, tool, **args):
    res = await c.call_tool(tool, args)
    assert not res.is_error, res.content[0].text
    return res.structured_content


async def refused(c, tool, **args) -> str:
    res = await c.call_tool(tool, args)
    assert res.is_error, res.structured_content
    return res.content[0].text


async def status_of(hub, run_id):
    async with hub.hub.db.read() as conn:
        return (await conn.execute(sa.select(task_runs.c.status).where(task_runs.c.id == run_id))).scalar()


async def is_running(hub, run_id):
    return await status_of(hub, run_id) == "running"


# ---------------------------------------------------------------- sessions and turns

async def test_a_turn_runs_on_the_runner_with_a_canonical_outcome_and_creates_no_taskrun(hub):
    await hub.start_runner()
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    ses = await hub.hub.sessions.create(admin, name="chat", profile="scripted")
    turn = await hub.hub.sessions.submit_turn(admin, ses["session_id"], "say hi there")
    view = await hub.hub.sessions.wait_turn(admin, turn, 10)
    assert view["status"] == "succeeded" and view["result"]["text"] == "hi there" and turn.startswith("turn_")
    assert await hub.hub.tasks.list(admin) == []  # conversation turns are not Task history
    assert await hub.hub.sessions.turn_outcome(turn) == "succeeded"


async def test_turns_of_one_session_run_one_at_a_time_in_order_in_one_workspace(hub):
    await hub.start_runner(slots=4)
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    sid = (await hub.hub.sessions.create(admin, profile="scripted"))["session_id"]
    first = await hub.hub.sessions.submit_turn(admin, sid, "write notes.txt one\nsleep 1.5\nsay first")
    second = await hub.hub.sessions.submit_turn(admin, sid, "say second")
    await eventually(lambda: is_running(hub, first))
    assert await status_of(hub, second) == "queued"
    done = await hub.hub.sessions.wait_turn(admin, second, 10)
    assert done["status"] == "succeeded"
    assert (await hub.hub.sessions.get_turn(admin, first))["changed_files"]["created"] == ["notes.txt"]


async def test_a_sessions_runtime_is_sticky_after_its_first_turn(hub):
    await hub.start_runner(name="r1", slots=1)
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    sid = (await hub.hub.sessions.create(admin, profile="scripted"))["session_id"]
    await hub.hub.sessions.wait_turn(admin, await hub.hub.sessions.submit_turn(admin, sid, "say a"), 10)
    await hub.start_runner(name="r2", slots=8)
    for text in ("say b", "say c"):
        view = await hub.hub.sessions.wait_turn(admin, await hub.hub.sessions.submit_turn(admin, sid, text), 10)
        assert view["runtime"] == "r1"


async def test_a_session_ref_resolves_by_id_or_name_and_refuses_nothing_or_two(hub):
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    await hub.start_runner()
    sid = (await hub.hub.sessions.create(admin, name="work", profile="scripted"))["session_id"]
    assert await hub.hub.sessions.resolve_ref(admin, "work") == sid == await hub.hub.sessions.resolve_ref(admin, sid)
    with pytest.raises(Exception, match="amux session create"):
        await hub.hub.sessions.resolve_ref(admin, "nope")
    with pytest.raises(Exception, match="already have a session named"):
        await hub.hub.sessions.create(admin, name="work", profile="scripted")
    async with hub.hub.db.write() as conn:  # a legacy duplicate name, from before names were unique
        row = (await conn.execute(sa.select(sessions).where(sessions.c.id == sid))).first()
        await conn.execute(sessions.insert().values({**row._mapping, "id": "ses_legacyduplicate"}))
    with pytest.raises(Exception, match="use the id"):
        await hub.hub.sessions.resolve_ref(admin, "work")


async def test_cli_session_commands_fall_back_to_AMUX_SESSION_ID(hub):
    await hub.start_runner()
    env = {**os.environ, "AMUX_HUB_URL": hub.url, "AMUX_TOKEN": hub.admin_token}

    async def amux(*args, extra=None):
        proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "hub.cli", *args, cwd=REPO,
                                                    env={**env, **(extra or {})}, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        return json.loads(out)

    ses = await amux("session", "create", "--name", "cli-chat", "--profile", "scripted", "--json")
    turn = await amux("session", "send", "say from the cli", "--json", extra={"AMUX_SESSION_ID": ses["session_id"]})
    assert turn["result"]["text"] == "from the cli"
    shown = await amux("session", "show", "cli-chat", "--json")
    assert shown["session_id"] == ses["session_id"] and shown["turns"][0]["status"] == "succeeded"


# ---------------------------------------------------------------- instances

async def test_followup_with_omitted_identity_restores_the_saved_profile_engine_and_model(hub):
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        inst = await ok(c, "instance_create", profile="scripted", model="pinned-model", name="helper")
        hub.hub.settings.profiles.default_profile = "claude"  # a new distribution default must not be selected
        up = await ok(c, "instance_followup", instance_id=inst["instance_id"], prompt="say one")
        task = await ok(c, "task_run", prompt="say unrelated", profile="scripted")
        got = await ok(c, "task_get", task_id=up["task_id"])
        while got["status"] not in ("succeeded", "failed"):
            got = await ok(c, "task_get", task_id=up["task_id"])
    assert got["snapshot"]["engine"] == "scripted" and got["snapshot"]["model"] == "pinned-model"
    assert task["status"] == "succeeded"


async def test_an_explicit_identity_or_policy_change_is_refused_by_the_no_switch_contract(hub):
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        iid = (await ok(c, "instance_create", profile="scripted"))["instance_id"]
        assert "cannot switch" in await refused(c, "instance_followup", instance_id=iid, prompt="say x",
                                                engine="claude")
        assert "cannot switch" in await refused(c, "instance_followup", instance_id=iid, prompt="say x", model="other")
        assert "new instance" in await refused(c, "instance_followup", instance_id=iid, prompt="say x",
                                               permission_policy="deny-all")
        assert (await ok(c, "instance_get", instance_id=iid))["mailbox_queued"] == 0


async def test_a_legacy_snapshot_without_a_frozen_policy_is_never_reused(hub):
    async with mcp_client(hub.url, hub.admin_token) as c:
        await hub.start_runner()
        iid = (await ok(c, "instance_create", profile="scripted"))["instance_id"]
        async with hub.hub.db.write() as conn:
            snap = (await conn.execute(sa.select(instances.c.snapshot).where(instances.c.id == iid))).scalar()
            snap.pop("permission_policy")
            await conn.execute(instances.update().where(instances.c.id == iid).values(snapshot=snap))
        assert "create a new instance" in await refused(c, "instance_followup", instance_id=iid, prompt="say x")


async def test_followup_on_an_archived_instance_is_refused(hub):
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        iid = (await ok(c, "instance_create", profile="scripted"))["instance_id"]
        assert (await ok(c, "instance_archive", instance_id=iid))["status"] == "archived"
        assert "instance_create" in await refused(c, "instance_followup", instance_id=iid, prompt="say x")
        assert "instance_create" in await refused(c, "instance_send", instance_id=iid, text="say x")


async def test_send_only_queues_and_mailbox_input_is_delivered_ahead_of_the_next_prompt(hub):
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        iid = (await ok(c, "instance_create", profile="scripted"))["instance_id"]
        await ok(c, "instance_send", instance_id=iid, text="say from the mailbox")
        view = await ok(c, "instance_get", instance_id=iid)
        assert view["status"] == "idle" and view["mailbox_queued"] == 1 and view["current_task_id"] is None
        up = await ok(c, "instance_followup", instance_id=iid, prompt="say the prompt")
        assert up["mailbox_delivered"] == 1
        done = await ok(c, "instance_wait", instance_id=iid, timeout_s=10)
    assert done["task"]["result"]["text"] == "from the mailbox\nthe prompt"


async def test_mailbox_input_goes_ahead_even_when_the_followup_reuses_a_still_running_child_session(hub):
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        iid = (await ok(c, "instance_create", profile="scripted"))["instance_id"]
        first = await ok(c, "instance_followup", instance_id=iid, prompt="sleep 0.4\nsay first")
        await eventually(lambda: is_running(hub, first["task_id"]))
        await ok(c, "instance_send", instance_id=iid, text="say queued while running")
        second = await ok(c, "instance_followup", instance_id=iid, prompt="say second")
        done = await ok(c, "instance_wait", instance_id=iid, timeout_s=10)
    assert done["task"]["task_id"] == second["task_id"]
    assert done["task"]["result"]["text"] == "queued while running\nsecond"


async def test_steer_reaches_the_running_turn(hub):
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        iid = (await ok(c, "instance_create", profile="scripted"))["instance_id"]
        up = await ok(c, "instance_followup", instance_id=iid, prompt="say waiting\nwait-steer 10\nsay after")
        await eventually(lambda: is_running(hub, up["task_id"]))
        ans = await ok(c, "instance_steer", instance_id=iid, text="use the other branch")
        done = await ok(c, "instance_wait", instance_id=iid, timeout_s=10)
    assert ans["delivery"] == "delivered"
    assert done["task"]["result"]["text"] == "waiting\nuse the other branch\nafter"


async def test_steer_that_no_turn_can_take_falls_back_to_the_mailbox(hub):
    await hub.start_runner(slots=1)
    async with mcp_client(hub.url, hub.admin_token) as c:
        blocker = await ok(c, "task_submit", prompt="sleep 3", profile="scripted")
        iid = (await ok(c, "instance_create", profile="scripted"))["instance_id"]
        await ok(c, "instance_followup", instance_id=iid, prompt="say first")  # queued behind the blocker
        ans = await ok(c, "instance_steer", instance_id=iid, text="say steered later")
        assert ans["delivery"] == "queued"
        await ok(c, "instance_wait", instance_id=iid, timeout_s=10)
        await ok(c, "instance_followup", instance_id=iid, prompt="say next")
        done = await ok(c, "instance_wait", instance_id=iid, timeout_s=10)
        await ok(c, "task_get", task_id=blocker["task_id"])
    assert done["task"]["result"]["text"] == "steered later\nnext"


async def test_steer_whose_delivery_is_unknown_is_not_queued(hub):
    runner = await hub.start_runner()
    hub.hub.instances.steer_wait_s = 0.3
    async with mcp_client(hub.url, hub.admin_token) as c:
        iid = (await ok(c, "instance_create", profile="scripted"))["instance_id"]
        up = await ok(c, "instance_followup", instance_id=iid, prompt="wait-steer 30")
        await eventually(lambda: is_running(hub, up["task_id"]))
        await runner.stop()  # the runner is gone; the hub still believes the turn runs
        ans = await ok(c, "instance_steer", instance_id=iid, text="nobody hears this")
        view = await ok(c, "instance_get", instance_id=iid)
    assert ans["delivery"] == "unknown" and view["mailbox_queued"] == 0


async def test_steer_on_an_idle_instance_falls_back_to_the_mailbox_ahead_of_the_next_prompt(hub):
    async with mcp_client(hub.url, hub.admin_token) as c:
        await hub.start_runner()
        iid = (await ok(c, "instance_create", profile="scripted"))["instance_id"]
        ans = await ok(c, "instance_steer", instance_id=iid, text="say steered while idle")
        assert ans["delivery"] == "queued" and "idle" in ans["note"] and ans["message_id"].startswith("mb_")
        assert (await ok(c, "instance_get", instance_id=iid))["mailbox_queued"] == 1
        up = await ok(c, "instance_followup", instance_id=iid, prompt="say next")
        done = await ok(c, "instance_wait", instance_id=iid, timeout_s=10)
    assert up["mailbox_delivered"] == 1
    assert done["task"]["result"]["text"] == "steered while idle\nnext" and done["mailbox_queued"] == 0


async def test_steer_on_an_instance_whose_last_run_ended_falls_back_to_the_mailbox(hub):
    async with mcp_client(hub.url, hub.admin_token) as c:
        await hub.start_runner()
        iid = (await ok(c, "instance_create", profile="scripted", prompt="say first"))["instance_id"]
        assert (await ok(c, "instance_wait", instance_id=iid, timeout_s=10))["task"]["status"] == "succeeded"
        ans = await ok(c, "instance_steer", instance_id=iid, text="say after the end")
        assert ans["delivery"] == "queued"
        await ok(c, "instance_followup", instance_id=iid, prompt="say again")
        done = await ok(c, "instance_wait", instance_id=iid, timeout_s=10)
    assert done["task"]["result"]["text"] == "after the end\nagain"


async def test_steer_on_an_archived_instance_is_refused_naming_instance_create_and_queues_nothing(hub):
    async with mcp_client(hub.url, hub.admin_token) as c:
        await hub.start_runner()
        iid = (await ok(c, "instance_create", profile="scripted"))["instance_id"]
        await ok(c, "instance_archive", instance_id=iid)
        text = await refused(c, "instance_steer", instance_id=iid, text="say too late")
        view = await ok(c, "instance_get", instance_id=iid)
    assert "archived" in text and "instance_create" in text
    assert view["status"] == "archived" and view["mailbox_queued"] == 0
    async with hub.hub.db.read() as conn:
        assert (await conn.execute(sa.select(sa.func.count()).select_from(mailbox)
                                   .where(mailbox.c.instance_id == iid))).scalar() == 0


async def test_interrupt_cancels_the_current_owner_taskrun_and_keeps_the_instance(hub):
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        iid = (await ok(c, "instance_create", profile="scripted"))["instance_id"]
        up = await ok(c, "instance_followup", instance_id=iid, prompt="say started\nsleep 30")
        await eventually(lambda: is_running(hub, up["task_id"]))
        await ok(c, "instance_interrupt", instance_id=iid)
        done = await ok(c, "instance_wait", instance_id=iid, timeout_s=10)
        assert done["task"]["status"] == "cancelled" and done["status"] == "idle"
        again = await ok(c, "instance_followup", instance_id=iid, prompt="say resumed")
        final = await ok(c, "instance_wait", instance_id=iid, timeout_s=10)
    assert final["task"]["task_id"] == again["task_id"] and final["task"]["status"] == "succeeded"


async def test_interrupt_cancels_every_unfinished_owner_run_the_running_one_and_the_followup_queued_behind_it(any_hub):
    hub = any_hub
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        iid = (await ok(c, "instance_create", profile="scripted"))["instance_id"]
        a = (await ok(c, "instance_followup", instance_id=iid, prompt="say a\nsleep 30"))["task_id"]
        await eventually(lambda: is_running(hub, a))
        b = (await ok(c, "instance_followup", instance_id=iid, prompt="say b"))["task_id"]
        view = await ok(c, "instance_get", instance_id=iid)
        assert view["status"] == "active" and view["unfinished_task_ids"] == [a, b]
        ans = await ok(c, "instance_interrupt", instance_id=iid)
        assert ans["task_id"] == a and {x["task_id"] for x in ans["cancelled"]} == {a, b}

        async def both_cancelled():
            return [await status_of(hub, a), await status_of(hub, b)] == ["cancelled", "cancelled"]
        await eventually(both_cancelled)
        view = await ok(c, "instance_get", instance_id=iid)
        assert view["status"] == "idle" and view["unfinished_task_ids"] == []
        again = (await ok(c, "instance_followup", instance_id=iid, prompt="say resumed"))["task_id"]
        final = await ok(c, "instance_wait", instance_id=iid, timeout_s=10)
    assert final["task"]["task_id"] == again and final["task"]["status"] == "succeeded"


async def test_an_instance_stays_active_and_archive_is_refused_while_an_earlier_owner_run_still_runs(any_hub):
    hub = any_hub
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        iid = (await ok(c, "instance_create", profile="scripted"))["instance_id"]
        a = (await ok(c, "instance_followup", instance_id=iid, prompt="say a\nsleep 30"))["task_id"]
        await eventually(lambda: is_running(hub, a))
        b = (await ok(c, "instance_followup", instance_id=iid, prompt="say b"))["task_id"]
        await ok(c, "task_cancel", task_id=b)  # the newest run (current_task_id) ends; A still runs
        assert await status_of(hub, b) == "cancelled" and await is_running(hub, a)
        view = await ok(c, "instance_get", instance_id=iid)
        assert view["current_task_id"] == b and view["status"] == "active" and view["unfinished_task_ids"] == [a]
        why = await refused(c, "instance_archive", instance_id=iid)
        assert a in why and "instance_interrupt" in why and "instance_wait" in why
        assert (await ok(c, "instance_get", instance_id=iid))["status"] == "active"
        await ok(c, "instance_interrupt", instance_id=iid)
        await eventually(lambda: _is(hub, a, "cancelled"))
        archived = await ok(c, "instance_archive", instance_id=iid)
    assert archived["status"] == "archived"


async def _is(hub, run_id, status):
    return await status_of(hub, run_id) == status


async def test_instance_wait_timeout_never_cancels_or_times_out_the_task(hub):
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        iid = (await ok(c, "instance_create", profile="scripted"))["instance_id"]
        up = await ok(c, "instance_followup", instance_id=iid, prompt="sleep 2\nsay done")
        early = await ok(c, "instance_wait", instance_id=iid, timeout_s=0.1)
        assert early["timed_out"] and early["status"] == "active"
        late = await ok(c, "instance_wait", instance_id=iid, timeout_s=10)
    assert late["task"]["task_id"] == up["task_id"] and late["task"]["status"] == "succeeded"


async def test_reusing_a_profile_reference_alone_creates_no_instance_reuse(hub):
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        a = await ok(c, "instance_create", profile="scripted")
        b = await ok(c, "instance_create", profile="scripted")
        t = await ok(c, "task_run", prompt="say plain", profile="scripted")
    assert a["instance_id"] != b["instance_id"] and a["session_id"] != b["session_id"]
    async with hub.hub.db.read() as conn:
        row = (await conn.execute(sa.select(task_runs).where(task_runs.c.id == t["task_id"]))).first()
    assert row.instance_id is None and row.session_id is None


# ---------------------------------------------------------------- coordination delegations

async def test_a_child_session_gets_its_id_the_hub_address_and_an_amux_session_token(hub):
    await hub.start_runner()
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    sid = (await hub.hub.sessions.create(admin, profile="scripted"))["session_id"]
    turn = await hub.hub.sessions.submit_turn(admin, sid, "env AMUX_SESSION_ID\nenv AMUX_HUB_URL\nenv AMUX_TOKEN")
    view = await hub.hub.sessions.wait_turn(admin, turn, 10)
    session_id, url, token = view["result"]["text"].split("\n")
    assert session_id == sid and url.startswith("http://") and token == "[redacted]"


async def test_a_delegation_with_an_amux_session_token_keeps_the_parent_session_and_its_active_turn(hub):
    await hub.start_runner()
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    sid = (await hub.hub.sessions.create(admin, profile="scripted", model="parent-model"))["session_id"]
    turn = await hub.hub.sessions.submit_turn(admin, sid, "wait-steer 10")
    await eventually(lambda: is_running(hub, turn))
    async with hub.hub.db.write() as conn:
        child_env = await turn_child_env(hub.hub, conn, admin.principal_id, sid)
    child = await hub.hub.auth.authenticate(child_env["AMUX_TOKEN"])
    assert child.label == f"amux-session:{sid}"
    delegated = await hub.hub.tasks.submit(child, SubmitRequest(prompt="say sub", profile="scripted"))
    plain = await hub.hub.tasks.submit(admin, SubmitRequest(prompt="say sub", profile="scripted"))
    async with hub.hub.db.read() as conn:
        rows = {r.id: r for r in await conn.execute(sa.select(task_runs).where(
            task_runs.c.id.in_([delegated["task_id"], plain["task_id"]])))}
    d, p = rows[delegated["task_id"]], rows[plain["task_id"]]
    assert (d.parent_session_id, d.parent_turn_id) == (sid, turn)
    assert d.snapshot["model"] == "parent-model" and d.snapshot["resolution"]["model"] == "session"
    assert (p.parent_session_id, p.parent_turn_id) == (None, None)
    await hub.hub.tasks.cancel(admin, turn)


async def test_coordination_wait_advances_over_tool_and_usage_events_without_waking_the_parent(hub):
    await hub.start_runner()
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    sid = (await hub.hub.sessions.create(admin, profile="scripted"))["session_id"]
    async with hub.hub.db.write() as conn:
        token = (await turn_child_env(hub.hub, conn, admin.principal_id, sid))["AMUX_TOKEN"]
    script = "tool Read 'read a'\nusage input=3 output=1\nsleep 1.5\nsay done"
    async with mcp_client(hub.url, token) as parent, mcp_client(hub.url, hub.admin_token) as other:
        t1 = await ok(parent, "task_submit", prompt=script, profile="scripted")
        page = await ok(parent, "task_wait", task_id=t1["task_id"], timeout_s=10)
        t2 = await ok(other, "task_submit", prompt=script, profile="scripted")
        first = await ok(other, "task_wait", task_id=t2["task_id"], timeout_s=10)
    assert [e["type"] for e in page["events"]] == ["tool", "usage", "text"] and page["cursor"] == 3
    assert [e["type"] for e in first["events"]] == ["tool", "usage"]


async def test_a_child_uses_amux_memory_with_the_token_its_launch_carries(hub):
    await hub.start_runner()
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    sid = (await hub.hub.sessions.create(admin, profile="scripted"))["session_id"]
    await hub.hub.sessions.wait_turn(admin, await hub.hub.sessions.submit_turn(admin, sid, "say bound"), 10)
    async with hub.hub.db.write() as conn:
        env = await turn_child_env(hub.hub, conn, admin.principal_id, sid)
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "hub.cli", "memory", "set", "plan", "ship friday", "--json", cwd=REPO,
        env={**os.environ, **env}, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert json.loads(out)["scope"] == f"principal:{admin.principal_id}"  # isolated by default
    assert (await hub.hub.memory.get(admin, "plan"))["value"] == "ship friday"


async def test_a_turn_that_ends_on_a_question_counts_as_delivered_for_schedule_reconciliation(hub):
    """A direct Session leaves questions to its UI, scheduled prompts included: the Turn waits for the user, and the
    canonical outcome a session-prompt firing reconciles to is `succeeded`, not unknown or failed."""
    await hub.start_runner()
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    sid = (await hub.hub.sessions.create(admin, profile="scripted"))["session_id"]
    turn = await hub.hub.sessions.submit_turn(admin, sid, "ask 'which branch?'")
    view = await hub.hub.sessions.wait_turn(admin, turn, 10)
    assert view["status"] == "waiting_for_user"
    assert await hub.hub.sessions.turn_outcome(turn) == "succeeded"


async def test_an_instance_run_is_a_task_child_its_token_names_its_session_but_it_gets_no_session_id(hub):
    """Only a direct Session's Turn is told AMUX_SESSION_ID (what gives its agent the hub's MCP tools); an instance's
    runs are task children: the memory CLI and a run token labelled with their session, no recursive task tools."""
    await hub.start_runner()
    admin = await hub.hub.auth.authenticate(hub.admin_token)
    inst = await hub.hub.instances.create(admin, profile="scripted",
                                          prompt="env AMUX_SESSION_ID\nenv AMUX_HUB_URL\nenv AMUX_TOKEN")
    await hub.hub.instances.wait(admin, inst["instance_id"], timeout_s=10)
    got = await hub.hub.tasks.get(admin, inst["task_id"])
    session_id, url, token = got["result"]["text"].split("\n")
    assert session_id == "" and url.startswith("http://") and token == "[redacted]"
