"""CLI parity: `amux instance …`, `amux session list|get|send` and `amux schedule update`, each with --json, run as
the real `amux` CLI in a subprocess against a real hub (and the REST routes they use)."""
from __future__ import annotations

import json

import httpx2
import sqlalchemy as sa

from hub.store.tables import mailbox, sessions, task_runs
from tests.helpers import eventually
from tests.integration.test_cli_rest import amux


class Cli:
    """The `amux` CLI pointed at a hub with one token."""

    def __init__(self, url: str, token: str) -> None:
        self.env = {"AMUX_HUB_URL": url, "AMUX_TOKEN": token}

    async def json(self, *args: str, env: dict | None = None) -> dict:
        """Run a command with --json; it must succeed."""
        code, out, err = await amux(*args, "--json", env={**self.env, **(env or {})})
        assert code == 0, err
        return json.loads(out)

    async def refused(self, *args: str) -> str:
        """Run a command that must be refused: exit 3 and one `amux: …` line naming the fix."""
        code, out, err = await amux(*args, env=self.env)
        assert code == 3 and err.startswith("amux: "), (code, out, err)
        return err


async def status_of(hub, run_id: str) -> str | None:
    async with hub.hub.db.read() as conn:
        return (await conn.execute(sa.select(task_runs.c.status).where(task_runs.c.id == run_id))).scalar()


async def test_cli_instance_create_send_steer_followup_get_and_archive_with_json(hub):
    await hub.start_runner()
    cli = Cli(hub.url, hub.admin_token)
    made = await cli.json("instance", "create", "--profile", "scripted", "--name", "helper")
    iid = made["instance_id"]
    sent = await cli.json("instance", "send", iid, "say from the mailbox")
    steered = await cli.json("instance", "steer", iid, "say steered while idle")
    done = await cli.json("instance", "followup", iid, "say the prompt", "--wait")
    got = await cli.json("instance", "get", iid)
    archived = await cli.json("instance", "archive", iid)
    refusal = await cli.refused("instance", "steer", iid, "say too late")
    assert made["status"] == "idle" and made["name"] == "helper" and made["engine"] == "scripted"
    assert sent["state"] == "queued" and steered["delivery"] == "queued"
    assert done["task"]["result"]["text"] == "from the mailbox\nsteered while idle\nthe prompt"
    assert done["status"] == "idle" and got["mailbox_queued"] == 0 and archived["status"] == "archived"
    assert "archived" in refusal and "instance_create" in refusal
    async with hub.hub.db.read() as conn:  # the refused correction left nothing behind
        assert (await conn.execute(sa.select(sa.func.count()).select_from(mailbox).where(
            mailbox.c.instance_id == iid, mailbox.c.state == "queued"))).scalar() == 0


async def test_cli_instance_steer_reaches_the_running_turn_and_interrupt_cancels_it_wait_timeout_does_not(hub):
    await hub.start_runner()
    cli = Cli(hub.url, hub.admin_token)
    script = "say waiting\nwait-steer 20\nsleep 30"
    made = await cli.json("instance", "create", "--profile", "scripted", "--prompt", script)
    iid, task_id = made["instance_id"], made["task_id"]
    await eventually(lambda: _is(hub, task_id, "running"))
    steered = await cli.json("instance", "steer", iid, "use the other branch")
    code, out, err = await amux("instance", "wait", iid, "--timeout", "0.2", "--json", env=cli.env)
    assert code == 5, err  # waited out: the run goes on
    early = json.loads(out)
    interrupted = await cli.json("instance", "interrupt", iid)
    code, out, err = await amux("instance", "wait", iid, "--timeout", "20", "--json", env=cli.env)
    assert code == 1, err  # the run ended cancelled, not succeeded
    final = json.loads(out)
    assert steered["delivery"] == "delivered"
    assert early["timed_out"] is True and early["status"] == "active"
    assert interrupted["task_id"] == task_id
    assert final["task"]["status"] == "cancelled" and final["status"] == "idle" and not final["timed_out"]


async def _is(hub, run_id: str, status: str) -> bool:
    return await status_of(hub, run_id) == status


async def test_cli_instance_followup_refuses_an_identity_change_naming_the_fix(hub):
    await hub.start_runner()
    cli = Cli(hub.url, hub.admin_token)
    iid = (await cli.json("instance", "create", "--profile", "scripted", "--model", "pinned"))["instance_id"]
    refusal = await cli.refused("instance", "followup", iid, "say x", "--model", "other")
    assert "cannot switch" in refusal and (await cli.json("instance", "get", iid))["current_task_id"] is None


async def test_cli_session_list_get_and_send_with_json_and_never_into_another_users_session(hub):
    await hub.start_runner()
    alice = Cli(hub.url, await hub.token("alice"))
    bob_caller = await hub.hub.auth.authenticate(await hub.token("bob"))
    bobs = (await hub.hub.sessions.create(bob_caller, profile="scripted"))["session_id"]
    made = await alice.json("session", "create", "--name", "desk", "--profile", "scripted")
    sid = made["session_id"]
    turn = await alice.json("session", "send", "desk", "say hello")
    listed = await alice.json("session", "list")
    got = await alice.json("session", "get", env={"AMUX_SESSION_ID": sid})
    refusal = await alice.refused("session", "send", bobs, "say intruding")
    assert turn["result"]["text"] == "hello" and turn["session_id"] == sid
    assert [s["session_id"] for s in listed["sessions"]] == [sid] and listed["sessions"][0]["turns"] == 1
    assert got["session_id"] == sid and [t["status"] for t in got["turns"]] == ["succeeded"]
    assert "session_list" in refusal and "another user" in refusal
    async with hub.hub.db.read() as conn:
        assert (await conn.execute(sa.select(sessions.c.turns).where(sessions.c.id == bobs))).scalar() == 0


async def test_cli_schedule_update_changes_given_fields_clears_a_choice_and_refuses_nothing_to_change(hub):
    await hub.start_runner()
    cli = Cli(hub.url, hub.admin_token)
    made = await cli.json("schedule", "create", "--type", "subtask", "--rule", "every 1h", "--prompt", "say hi",
                          "--profile", "scripted", "--model", "m1", "--name", "hourly")
    sid = made["schedule_id"]
    changed = await cli.json("schedule", "update", sid, "--rule", "every 2h", "--name", "two-hourly", "--model", "",
                             "--notify", "all")
    refusal = await cli.refused("schedule", "update", sid)
    got = await cli.json("schedule", "get", sid)
    assert made["model"] == "m1" and changed["name"] == "two-hourly" and changed["model"] is None
    assert "2h" in changed["rule"] and changed["notify"] == "all" and changed["profile"] == "scripted"
    assert "nothing to update" in refusal and got["name"] == "two-hourly"


async def test_rest_instance_routes_answer_like_the_mcp_tools_and_refuse_an_archived_instances_steer(hub):
    await hub.start_runner()
    async with httpx2.AsyncClient(base_url=f"{hub.url}/api/v1", timeout=30,
                                  headers={"Authorization": f"Bearer {hub.admin_token}"}) as http:
        made = await http.post("/instances", json={"profile": "scripted"})
        iid = made.json()["instance_id"]
        up = await http.post(f"/instances/{iid}/followups", json={"prompt": "say rest"})
        waited = await http.get(f"/instances/{iid}/wait", params={"timeout_s": 10})
        archived = await http.post(f"/instances/{iid}/archive")
        steer = await http.post(f"/instances/{iid}/steer", json={"text": "say late"})
        unknown = await http.post(f"/instances/{iid}/followups", json={"prompt": "x", "colour": "red"})
    assert made.status_code == 201 and up.status_code == 201 and up.json()["task_id"].startswith("tr_")
    assert waited.json()["task"]["result"]["text"] == "rest" and archived.json()["status"] == "archived"
    assert steer.status_code == 409 and "instance_create" in steer.json()["fix"]
    assert unknown.status_code == 400 and "unknown fields ['colour']" in unknown.json()["fix"]
