"""Questions reach a person in direct Sessions; Tasks keep failing with the bilingual diagnostic.

End to end over real HTTP: a signed Feishu chat message → the chat Session's Turn → the runner launches the fake
Claude Code CLI (a real subprocess printing the recorded AskUserQuestion stream) → the Turn ends `waiting_for_user`
with its question → the bot posts the question card to the fake Feishu → a signed card callback built from THAT
card's own button → the option is the Session's next Turn, launched with `--resume <the CLI's session id>` → the
agent's reply is posted under the card. A chat reply answers in free text; a second answer or one after the Turn
was cancelled is refused with a toast and nothing changed. Over MCP, session_get shows the waiting question and
session_send answers it.
"""
from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import aiohttp
import pytest
import sqlalchemy as sa

from hub.clock import ManualClock
from hub.config import FeishuAppSettings
from hub.engines.claude import ClaudeEngine
from hub.runner.agent import Runner
from hub.runner.protocol import QUESTION_DIAGNOSTIC
from hub.services.tasks.service import SubmitRequest
from hub.store.tables import session_questions, task_runs
from tests.fakes.feishu import FakeFeishu, card_buttons, card_text, clock_seconds, signed_card_callback
from tests.helpers import PROCESS_MODE, REPO, eventually, HubHandle, mcp_client, start_hub, started
from tests.integration.test_cli_rest import amux
from tests.integration.test_session_agent_mcp import post_message

BIN = REPO / "tests" / "fakes" / "bin"
ADMIN, ALICE = "ou_admin", "ou_alice"
EK, VT = "agent-encrypt-key", "agent-verification-token"
CLAUDE_SESSION = "0b6f8a52-6a3e-4f3b-9a1c-5d2e7c9f1a01"  # the session id of the recorded question stream


class Chat:
    """A hub with one webhook-mode Feishu app on a real port, a runner with the fake Claude CLI, alice's chat."""

    def __init__(self, handle: HubHandle, fake: FakeFeishu, clock: ManualClock, record: Path) -> None:
        self.handle, self.hub, self.fake, self.clock, self.record = handle, handle.hub, fake, clock, record

    async def say(self, text: str) -> str:
        """Post `text` in alice's chat; return its message id."""
        return await post_message(self.handle.url, self.fake.app_id, self.fake, self.clock, ALICE, text)

    async def reply_to(self, mid: str, n: int = 1) -> dict:
        """Wait for the bot's `n`-th reply under message `mid` to be final (a progress card becomes the answer or
        the question card: no Stop left); return its message id and that card."""
        async def found() -> dict | None:
            got = [m for m in self.fake.sent if m.reply_to == mid]
            if len(got) < n:
                return None
            doc = got[n - 1].updates[-1] if got[n - 1].updates else got[n - 1].content
            return None if '"op": "stop"' in json.dumps(doc) else {"message_id": got[n - 1].message_id,
                                                                    "content": doc}
        return await eventually(found, timeout=60)

    async def press(self, value: dict, message_id: str) -> dict:
        """POST a signed, encrypted card callback as Feishu builds it; return the JSON answer."""
        body, headers = signed_card_callback(app_id=self.fake.app_id, open_id=ALICE, value=value, message_id=message_id,
                                             now_s=self.clock.now().timestamp(), token=VT, encrypt_key=EK)
        async with aiohttp.ClientSession() as s, s.post(f"{self.handle.url}/feishu/{self.fake.app_id}/events",
                                                          data=body, headers=headers) as r:
            assert r.status == 200, await r.text()
            return await r.json(content_type=None)

    async def turns(self) -> list:
        async with self.hub.db.read() as conn:
            return list((await conn.execute(sa.select(task_runs).where(task_runs.c.kind == "turn")
                                            .order_by(task_runs.c.turn_seq))).all())

    async def questions(self) -> list:
        async with self.hub.db.read() as conn:
            return list((await conn.execute(sa.select(session_questions))).all())

    def launches(self) -> list[dict]:
        """The prompts the fake CLI was given, in order (its `user` stdin messages)."""
        lines = (self.record / "stdin.jsonl").read_text().splitlines()
        return [json.loads(x) for x in lines if json.loads(x).get("type") == "user"]


def launcher(tmp_path: Path, record: Path, scenario: str) -> Path:
    """An executable that starts the fake Claude CLI with a scenario (the runner passes no test variables on)."""
    path = tmp_path / "claude-agent"
    path.write_text(f"#!/bin/sh\nFAKE_SCENARIO={scenario} FAKE_RECORD_DIR={record} exec {sys.executable} "
                    f"{BIN / 'claude'} \"$@\"\n")
    path.chmod(0o755)
    return path


async def start_chat(db_url: str, tmp_path: Path, clock: ManualClock, monkeypatch, scenario: str) -> Chat:
    record = tmp_path / "record"
    record.mkdir()
    monkeypatch.setenv("AMUX_CLAUDE_BIN", str(launcher(tmp_path, record, scenario)))
    fake = await FakeFeishu(now=clock_seconds(clock)).start()
    app = FeishuAppSettings(app_id=fake.app_id, app_secret=fake.app_secret, encrypt_key=EK, verification_token=VT,
                            admin_open_id=ADMIN, base_url=fake.base_url)
    handle = await start_hub(db_url, tmp_path, clock, feishu_apps=[app])
    handle.hub.settings.profiles.default_profile = "claude"
    runner = Runner(handle.url, handle.admin_token, name="agents", slots=4,
                    **PROCESS_MODE, workspace_root=tmp_path / "ws",
                    engines={"claude": ClaudeEngine()})
    handle.runners.append((runner, asyncio.create_task(runner.run_forever())))
    await started(runner.registered.wait(), "the runner to register")
    return Chat(handle, fake, clock, record)


@pytest.fixture
async def chat(db_url: str, tmp_path: Path, clock: ManualClock, monkeypatch):
    c = await start_chat(db_url, tmp_path, clock, monkeypatch, "ask-until-resumed")
    yield c
    await c.handle.stop()
    await c.fake.stop()


def answer_of(card: dict) -> str:
    """The agent's answer on a final card (its one language-neutral markdown element)."""
    [text] = [e["content"] for e in card["body"]["elements"] if e.get("tag") == "markdown" and "i18n_content" not in e]
    return text


def buttons(card: dict) -> dict[str, dict]:
    """Return the card's buttons: English label → callback value."""
    return {b["text"]["content"]: b["behaviors"][0]["value"] for b in card_buttons(card)}


async def ask(chat: Chat) -> tuple[str, dict]:
    """Say something that makes the agent ask; return the question card's message id and the card."""
    mid = await chat.say("set up the storage for the service")
    posted = await chat.reply_to(mid)
    return posted["message_id"], posted["content"]


async def test_a_chat_question_becomes_a_card_whose_button_answers_as_the_resumed_next_turn(chat: Chat):
    card_id, card = await ask(chat)
    assert "Which database should I use?" in card_text(card) and "reply to this chat" in card_text(card)
    assert "智能体提问" in card_text(card, "zh_cn") and "回复你自己的答案" in card_text(card, "zh_cn")
    assert sorted(buttons(card)) == ["PostgreSQL", "SQLite"]
    [turn] = await chat.turns()
    [q] = await chat.questions()
    assert turn.status == "waiting_for_user" and turn.error is None, turn.error
    assert (q.turn_id, q.text, q.options, q.free_text, q.state) == (
        turn.id, "Which database should I use?", ["PostgreSQL", "SQLite"], True, "open")

    answer = await chat.press(buttons(card)["SQLite"], card_id)
    assert answer["toast"]["type"] == "success" and "回复" in answer["toast"]["i18n"]["zh_cn"]
    assert "Answered: SQLite" in card_text(answer["card"]["data"]).replace("*", "")
    assert buttons(answer["card"]["data"]) == {}  # the receipt has nothing left to press
    follow = await chat.reply_to(card_id)
    assert answer_of(follow["content"]) == "Going ahead with: SQLite"

    first, second = await chat.turns()
    assert second.status == "succeeded" and second.prompt == "SQLite" and second.session_id == first.session_id
    assert second.snapshot["resume_handle"] == CLAUDE_SESSION  # resumed with the provider's handle
    argv = json.loads((chat.record / "argv.json").read_text())
    assert argv[argv.index("--resume") + 1] == CLAUDE_SESSION
    assert [m["message"]["content"] for m in chat.launches()][-1] == "SQLite"
    [q] = await chat.questions()
    assert (q.state, q.answer, q.answer_turn_id) == ("answered", "SQLite", second.id)

    again = await chat.press(buttons(card)["PostgreSQL"], card_id)  # the same card's other button, later
    assert again["toast"]["type"] == "warning" and "already answered" in again["toast"]["content"]
    assert "已经回答" in again["toast"]["i18n"]["zh_cn"] and "card" not in again
    assert len(await chat.turns()) == 2 and (await chat.questions())[0].answer == "SQLite"  # nothing changed


async def test_a_chat_reply_answers_the_question_in_free_text_and_the_card_then_refuses(chat: Chat):
    card_id, card = await ask(chat)
    mid = await chat.say("MySQL, actually")
    follow = await chat.reply_to(mid)
    assert answer_of(follow["content"]) == "Going ahead with: MySQL, actually"
    first, second = await chat.turns()
    assert second.snapshot["resume_handle"] == CLAUDE_SESSION and second.status == "succeeded"
    [q] = await chat.questions()
    assert (q.state, q.answer, q.answer_turn_id) == ("answered", "MySQL, actually", second.id)
    refused = await chat.press(buttons(card)["SQLite"], card_id)
    assert refused["toast"]["type"] == "warning" and second.id in refused["toast"]["content"]
    assert len(await chat.turns()) == 2


async def test_a_question_whose_turn_was_cancelled_takes_no_answer(chat: Chat):
    card_id, card = await ask(chat)
    [turn] = await chat.turns()
    admin = await chat.hub.auth.authenticate(chat.handle.admin_token)
    cancelled = await chat.hub.tasks.cancel(admin, turn.id)
    assert cancelled["status"] == "cancelled"
    refused = await chat.press(buttons(card)["SQLite"], card_id)
    assert refused["toast"]["type"] == "warning" and "cancelled" in refused["toast"]["content"]
    assert "已取消" in refused["toast"]["i18n"]["zh_cn"]
    [turn] = await chat.turns()
    [q] = await chat.questions()
    assert (turn.status, q.state, q.answer) == ("cancelled", "withdrawn", None)  # nothing else changed


async def test_session_get_shows_the_waiting_question_and_session_send_answers_it(chat: Chat):
    token = await chat.handle.token("bob")
    bob = await chat.hub.auth.authenticate(token)
    created = await chat.hub.sessions.create(bob, name="desk", profile="claude")
    async with mcp_client(chat.handle.url, token) as c:
        sent = (await c.call_tool("session_send", {"text": "set up storage", "session_ref": "desk", "wait": True,
                                                   "timeout_s": 60})).structured_content
        assert sent["status"] == "waiting_for_user" and sent["question"]["options"] == ["PostgreSQL", "SQLite"]
        view = (await c.call_tool("session_get", {"session_ref": "desk"})).structured_content
        assert view["question"]["text"] == "Which database should I use?" and view["question"]["state"] == "open"
        assert view["question"]["turn_id"] == sent["turn_id"]
        done = (await c.call_tool("session_send", {"text": "PostgreSQL", "session_ref": "desk", "wait": True,
                                                   "timeout_s": 60})).structured_content
        assert done["status"] == "succeeded" and done["result"]["text"] == "Going ahead with: PostgreSQL"
        view = (await c.call_tool("session_get", {"session_ref": "desk"})).structured_content
    assert view["question"] is None and view["session_id"] == created["session_id"]
    q = (await chat.questions())[0]
    assert (q.state, q.answer, q.answer_turn_id) == ("answered", "PostgreSQL", done["turn_id"])


async def test_amux_session_get_shows_the_waiting_question_and_amux_session_send_answers_it(chat: Chat):
    token = await chat.handle.token("carol")
    env = {"AMUX_HUB_URL": chat.handle.url, "AMUX_TOKEN": token}
    code, out, err = await amux("session", "create", "--name", "desk", "--profile", "claude", "--json", env=env)
    assert code == 0, err
    code, out, err = await amux("session", "send", "desk", "set up storage", "--json", env=env)
    assert code == 1 and json.loads(out)["status"] == "waiting_for_user", (out, err)  # not succeeded: exit 1
    code, human, err = await amux("session", "get", "desk", env=env)
    assert code == 0, err
    assert "waiting for your answer" in human and "Which database should I use?" in human
    assert "options: PostgreSQL | SQLite" in human and "amux session send" in human
    code, out, err = await amux("session", "send", "desk", "SQLite", "--json", env=env)
    assert code == 0 and json.loads(out)["result"]["text"] == "Going ahead with: SQLite", (out, err)
    code, out, err = await amux("session", "get", "desk", "--json", env=env)
    assert code == 0 and json.loads(out)["question"] is None


async def test_a_tasks_and_an_instance_runs_question_still_fail_with_the_bilingual_diagnostic(
        sqlite_url: str, tmp_path: Path, clock: ManualClock, monkeypatch):
    c = await start_chat(sqlite_url, tmp_path, clock, monkeypatch, "question")
    try:
        admin = await c.hub.auth.authenticate(c.handle.admin_token)
        t = await c.hub.tasks.submit(admin, SubmitRequest(prompt="set up storage", profile="claude"))
        done = await c.hub.tasks.wait_terminal(admin, t["task_id"], timeout_s=60)
        assert done["status"] == "failed" and done["error"] == QUESTION_DIAGNOSTIC
        assert "interactive session" in done["error"] and "交互式会话" in done["error"]
        inst = await c.hub.instances.create(admin, profile="claude", prompt="set up storage")  # an instance run
        ran = await c.hub.tasks.wait_terminal(admin, inst["task_id"], timeout_s=60)
        assert ran["status"] == "failed" and ran["error"] == QUESTION_DIAGNOSTIC
        assert await c.questions() == []
    finally:
        await c.handle.stop()
        await c.fake.stop()
