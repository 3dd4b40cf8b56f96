"""The chat flow over the fake Feishu Open Platform: signed webhooks, the real lark-oapi SDK, callbacks built from
the card's own buttons, the scripted engine on an in-process runner.

A message gets a progress card under it at once; the card shows the tools in use and is PATCHed into the answer;
a long answer follows in parts; a message while the Turn runs steers it; Stop interrupts it; each bad input is
refused with a clear message and nothing changed.
"""
from __future__ import annotations

import asyncio
from datetime import timedelta
from pathlib import Path

import aiohttp
import pytest
import sqlalchemy as sa

from bot.cards.chat import split_answer
from hub.clock import ManualClock
from hub.config import FeishuAppSettings
from hub.store.tables import bot_chats, chat_turns, mailbox, outbox, task_runs
from tests.fakes.feishu import FakeFeishu, card_buttons, card_text, clock_seconds, signed_card_callback
from tests.helpers import HubHandle, eventually, start_hub
from tests.integration.test_session_agent_mcp import EK, VT, post_message

ADMIN, ALICE, BOB = "ou_admin", "ou_alice", "ou_bob"


class Chat:
    """A hub with one webhook-mode Feishu app whose chats run the scripted profile, and a runner."""

    def __init__(self, handle: HubHandle, fake: FakeFeishu, clock: ManualClock) -> None:
        self.handle, self.hub, self.fake, self.clock = handle, handle.hub, fake, clock

    async def say(self, text: str, who: str = ALICE) -> str:
        return await post_message(self.handle.url, self.fake.app_id, self.fake, self.clock, who, text)

    async def card_under(self, mid: str, n: int = 1):
        """Wait for the bot's `n`-th reply under `mid`; return the fake's message (its `updates` are the PATCHes)."""
        async def found():
            got = [m for m in self.fake.sent if m.reply_to == mid]
            return got[n - 1] if len(got) >= n else None
        return await eventually(found, timeout=30)

    async def latest(self, mid: str, predicate, timeout: float = 30):
        """Wait until the card under `mid` (as last PATCHed) satisfies `predicate`; return that card."""
        m = await self.card_under(mid)

        async def ok():
            doc = m.updates[-1] if m.updates else m.content
            return doc if predicate(doc) else None
        return await eventually(ok, timeout=timeout)

    async def press(self, value: dict, message_id: str, who: str = ALICE) -> dict:
        body, headers = signed_card_callback(app_id=self.fake.app_id, open_id=who, value=value, message_id=message_id,
                                             now_s=self.clock.now().timestamp(), token=VT, encrypt_key=EK)
        async with aiohttp.ClientSession() as s, s.post(f"{self.handle.url}/feishu/{self.fake.app_id}/events",
                                                          data=body, headers=headers) as r:
            assert r.status == 200, await r.text()
            return await r.json(content_type=None)

    async def rows(self, table, *where):
        async with self.hub.db.read() as conn:
            return list((await conn.execute(sa.select(table).where(*where))).all())

    async def turn_status(self, turn_id: str) -> str:
        [row] = await self.rows(task_runs, task_runs.c.id == turn_id)
        return row.status


def all_text(doc: dict) -> str:
    """The card's English text, its language-neutral answer elements included."""
    out = [card_text(doc)]

    def walk(node):
        if isinstance(node, dict):
            if node.get("tag") == "markdown" and "i18n_content" not in node:
                out.append(node.get("content", ""))
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(doc)
    return "\n".join(out)


def labels(doc: dict) -> list[str]:
    return [b["text"]["content"] for b in card_buttons(doc)]


def stop_button(doc: dict) -> dict:
    [value] = [b["behaviors"][0]["value"] for b in card_buttons(doc) if b["text"]["content"] == "Stop"]
    return value


async def start_chat(db_url: str, tmp_path: Path, clock: ManualClock, profile: str | None = "scripted") -> Chat:
    fake = await FakeFeishu(now=clock_seconds(clock)).start()
    app = FeishuAppSettings(app_id=fake.app_id, app_secret=fake.app_secret, encrypt_key=EK, verification_token=VT,
                            admin_open_id=ADMIN, base_url=fake.base_url, profile=profile)
    handle = await start_hub(db_url, tmp_path, clock, feishu_apps=[app])
    await handle.start_runner(slots=4)
    return Chat(handle, fake, clock)


@pytest.fixture
async def chat(sqlite_url: str, tmp_path: Path, clock: ManualClock):
    c = await start_chat(sqlite_url, tmp_path, clock)
    yield c
    await c.handle.stop()
    await c.fake.stop()


async def test_a_message_gets_a_progress_card_with_its_tools_that_becomes_the_answer(chat: Chat):
    mid = await chat.say("tool Read 'read the release notes'\nwait-steer 30\nsay all done")
    first = await chat.card_under(mid)
    assert "The agent is on it" in card_text(first.content) and "智能体" in card_text(first.content, "zh_cn")
    assert first.content["schema"] == "2.0" and stop_button(first.content)["t"].startswith("turn")
    chat.clock.advance(3)  # past the update pace: the next check PATCHes what changed
    running = await chat.latest(mid, lambda d: "read the release notes" in card_text(d))
    assert "Working" in card_text(running)
    steer = await chat.say("also mention the date")  # steers the running Turn (wait-steer takes it)
    done = await chat.latest(mid, lambda d: "all done" in all_text(d))
    assert "also mention the date" in all_text(done) and "delivered to the running turn" in card_text(done)
    assert labels(done) == ["Agent Timeline"]  # nothing left to stop; the Turn's timeline is one click away
    assert card_buttons(done)[0]["behaviors"][0]["value"]["r"] == stop_button(first.content)["t"]
    assert [m for m in chat.fake.sent if m.reply_to == steer] == []  # a steer opens no second card or Turn
    assert len(await chat.rows(task_runs, task_runs.c.kind == "turn")) == 1
    [row] = await chat.rows(chat_turns)
    assert row.state == "done"
    kinds = [n.kind for n in await chat.rows(outbox, outbox.c.turn_id == row.turn_id)]
    assert kinds[0] == "chat_card" and set(kinds) <= {"chat_card", "chat_update"}


async def test_an_answer_longer_than_a_card_follows_in_parts_and_nothing_is_cut(chat: Chat):
    lines = [f"line {i:05d} " + "x" * 90 for i in range(400)]  # about 40 KB: more than one card holds
    mid = await chat.say("\n".join(f"say {line}" for line in lines))
    done = await chat.latest(mid, lambda d: "follows in" in card_text(d))
    n = len(split_answer("\n".join(lines)))
    assert n >= 2 and f"follows in {n} parts" in card_text(done)

    async def parts():
        got = [m for m in chat.fake.sent if m.reply_to == mid][1:]
        return got if len(got) == n else None
    got = await eventually(parts, timeout=30)
    assert [f"part {i} of {n}" in card_text(m.content) for i, m in enumerate(got, 1)] == [True] * n
    text = "\n".join(all_text(m.content).split("\n", 1)[1] for m in got)
    assert all(line in text for line in lines)  # every line arrived


async def test_stop_on_the_card_interrupts_the_turn_and_refuses_a_second_stop_and_another_person(chat: Chat):
    mid = await chat.say("tool Bash 'run the long job'\nsleep 60\nsay never")
    card = await chat.card_under(mid)
    value = stop_button(card.content)
    await eventually(lambda: _running(chat, value["t"]), timeout=20)
    other = await chat.press(value, card.message_id, who=BOB)  # bob presses alice's card
    assert other["toast"]["type"] == "error" and "another person" in other["toast"]["content"]
    assert await chat.turn_status(value["t"]) == "running"  # nothing changed
    answer = await chat.press(value, card.message_id)
    assert answer["toast"]["type"] == "info"
    stopped = await chat.latest(mid, lambda d: "Stopped" in card_text(d))
    assert "停止" in card_text(stopped, "zh_cn") and labels(stopped) == ["Agent Timeline"]
    assert await chat.turn_status(value["t"]) == "cancelled"
    again = await chat.press(value, card.message_id)  # the same card's button, after the Turn ended
    assert again["toast"]["type"] == "warning" and "already finished" in again["toast"]["content"]
    assert await chat.turn_status(value["t"]) == "cancelled"


async def _running(chat: Chat, turn_id: str) -> bool:
    return await chat.turn_status(turn_id) == "running"


async def test_a_message_after_the_turn_ended_becomes_the_next_turn_and_its_card_says_so(chat: Chat):
    mid = await chat.say("say first")
    await chat.latest(mid, lambda d: "first" in all_text(d) and "Done" in card_text(d))
    async def behind():  # its driver has not caught up yet (its replica died, say); late wake-ups may re-drive it
        async with chat.hub.db.write() as conn:
            await conn.execute(chat_turns.update().values(state="running",
                                                          next_check_at=chat.clock.now() + timedelta(hours=1)))
        await asyncio.sleep(0.3)
        return [r for r in await chat.rows(chat_turns) if r.state == "running"]
    await eventually(behind, timeout=10)
    nxt = await chat.say("say second")
    card = await chat.card_under(nxt)
    assert "previous turn had already ended" in card_text(card.content)
    await chat.latest(nxt, lambda d: "second" in all_text(d) and "Done" in card_text(d))
    assert len(await chat.rows(task_runs, task_runs.c.kind == "turn")) == 2
    assert await chat.rows(mailbox) == []  # no steer was offered to the ended Turn


async def test_a_part_that_feishu_refuses_once_is_not_overtaken_by_the_parts_after_it(chat: Chat):
    lines = [f"line {i:05d} " + "x" * 90 for i in range(400)]
    mid = await chat.say("\n".join(f"say {line}" for line in lines))
    await chat.card_under(mid)  # the progress card is out: the next reply is the answer's first part
    chat.fake.fail("5xx", times=1, op="reply")
    n = len(split_answer("\n".join(lines)))

    async def parts():
        chat.clock.advance(30)  # the failed part's backoff and the held parts' claims pass on the injected clock
        got = [m for m in chat.fake.sent if m.reply_to == mid][1:]
        return got if len(got) == n else None
    got = await eventually(parts, timeout=40, interval=0.2)
    assert [f"part {i} of {n}" in card_text(m.content) for i, m in enumerate(got, 1)] == [True] * n


async def test_a_card_survives_feishu_5xx_and_is_delivered_once(chat: Chat):
    chat.fake.fail("5xx", times=2, op="reply")
    mid = await chat.say("say through the errors")

    async def retried():  # the retry waits its backoff on the injected clock
        chat.clock.advance(30)
        got = [m for m in chat.fake.sent if m.reply_to == mid]
        return got and "through the errors" in all_text(got[0].updates[-1] if got[0].updates else got[0].content)
    await eventually(retried, timeout=40, interval=0.2)
    assert len([m for m in chat.fake.sent if m.reply_to == mid]) == 1
    replies = [r for r in chat.fake.requests if r[0] == "reply"]
    assert len(replies) >= 3 and len({r[1] for r in replies}) == 1  # retried with the same uuid


async def test_a_chat_without_an_agent_engine_says_so_with_the_fix(sqlite_url: str, tmp_path: Path,
                                                                    clock: ManualClock):
    c = await start_chat(sqlite_url, tmp_path, clock, profile=None)  # the hub's default is the scripted test engine
    try:
        mid = await c.say("hello")
        reply = await c.card_under(mid)
        text = card_text(reply.content)
        assert "no agent engine" in text and "[[feishu.apps]]" in text and "amux profile list" in text
        assert "智能体引擎" in card_text(reply.content, "zh_cn")
        assert await c.rows(bot_chats) == [] and await c.rows(task_runs) == []  # nothing was created
    finally:
        await c.handle.stop()
        await c.fake.stop()


async def test_the_progress_cards_timeline_button_lands_its_owner_on_the_turns_timeline_page(chat: Chat):
    import re

    import httpx2

    chat.hub.runner_dispatch.hub_url = chat.handle.url  # the links' base, as `amux up` sets it
    mid = await chat.say("tool Read 'read the release notes'\nsay all done")
    done = await chat.latest(mid, lambda d: "all done" in all_text(d))
    [value] = [b["behaviors"][0]["value"] for b in card_buttons(done) if b["text"]["content"] == "Agent Timeline"]
    card = await chat.card_under(mid)
    refused = await chat.press(value, card.message_id, who=BOB)  # another person's click sends nothing
    assert refused["toast"]["type"] == "error", refused
    before = len(chat.fake.sent)
    answer = await chat.press(value, card.message_id)
    assert answer["toast"]["type"] == "success", answer

    async def private():
        return next((m for m in chat.fake.sent[before:] if m.receive_id == ALICE and m.reply_to is None), None)
    sent = await eventually(private)
    link = re.search(r"\((http://[^)]+/oauth/login\?code=[^)&]+&next=[^)]+)\)", card_text(sent.content)).group(1)
    code, nxt = link.split("code=", 1)[1].split("&next=")
    assert nxt == f"/timeline/turns/{value['r']}" and "amux." not in link  # a one-time code, never a token
    async with httpx2.AsyncClient(timeout=10, follow_redirects=False) as browser:
        login = await browser.post(f"{chat.handle.url}/oauth/login", data={"code": code, "next": nxt})
        assert login.status_code == 303 and login.headers["location"] == nxt
        page = await browser.get(f"{chat.handle.url}{nxt}")
        assert page.status_code == 200 and "read the release notes" in page.text  # what the agent did, raw
