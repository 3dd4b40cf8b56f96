"""The Feishu channel and the bot's messenger keep one HTTP client per application, over real HTTP to the fake."""
from __future__ import annotations

from hub.config import FeishuAppSettings
from hub.services.alerts.channel import OK, RETRY
from tests.fakes.feishu import FakeFeishu

VIEW = {"v": 1, "kind": "receipt", "schedule_name": "nightly", "creator": "alice", "outcome": "succeeded"}


def _apps(*fakes: FakeFeishu) -> list[FeishuAppSettings]:
    return [FeishuAppSettings(app_id=f.app_id, app_secret=f.app_secret, base_url=f.base_url) for f in fakes]


async def test_the_token_and_sequential_sends_of_one_app_reuse_one_kept_alive_connection():
    from bot.feishu.channel import FeishuChannel

    fake = await FakeFeishu().start()
    ch = FeishuChannel(_apps(fake), user_rate=0)
    try:
        for i in range(12):
            d = await ch.send(fake.app_id, f"ou_user{i}", VIEW, f"ntc_keep{i:03d}")
            assert d.result == OK and d.message_id
        first = fake.sent[0].message_id
        assert (await ch.update(fake.app_id, first, VIEW)).result == OK
        assert (await ch.reply(fake.app_id, first, VIEW, "ntc_keep_reply")).result == OK
        assert len(fake.connections) == 1
        assert fake.token_fetches == 1
    finally:
        await ch.aclose()
        await fake.stop()


async def test_each_application_has_its_own_client_and_token():
    from bot.feishu.channel import FeishuChannel

    a, b = await FakeFeishu().start(), await FakeFeishu().start()
    ch = FeishuChannel(_apps(a, b), user_rate=0)
    try:
        assert (await ch.send(a.app_id, "ou_x", VIEW, "ntc_app_a")).result == OK
        assert (await ch.send(b.app_id, "ou_x", VIEW, "ntc_app_b")).result == OK
        assert [m.uuid for m in a.sent] == ["ntc_app_a"] and [m.uuid for m in b.sent] == ["ntc_app_b"]
        assert ch.apps[a.app_id].http.session is not ch.apps[b.app_id].http.session
    finally:
        await ch.aclose()
        await a.stop()
        await b.stop()


async def test_a_closed_channel_opens_a_fresh_client_on_its_next_call():
    from bot.feishu.channel import FeishuChannel

    fake = await FakeFeishu().start()
    ch = FeishuChannel(_apps(fake), user_rate=0)
    try:
        assert (await ch.send(fake.app_id, "ou_x", VIEW, "ntc_before_close")).result == OK
        await ch.aclose()
        assert (await ch.send(fake.app_id, "ou_x", VIEW, "ntc_after_close")).result == OK
        assert [m.uuid for m in fake.sent] == ["ntc_before_close", "ntc_after_close"]
    finally:
        await ch.aclose()
        await fake.stop()


async def test_a_non_json_answer_and_a_refused_connection_are_retries():
    from bot.feishu.channel import FeishuChannel

    fake = await FakeFeishu().start()
    ch = FeishuChannel(_apps(fake), user_rate=0)
    try:
        fake.fail("nonjson", op="send")
        d = await ch.send(fake.app_id, "ou_x", VIEW, "ntc_nonjson")
        assert d.result == RETRY
        await fake.stop()
        d = await ch.send(fake.app_id, "ou_x", VIEW, "ntc_refused")
        assert d.result == RETRY and d.error
    finally:
        await ch.aclose()
        await fake.stop()


async def test_the_messenger_replies_and_patches_over_one_connection_with_the_path_quoted():
    from bot.feishu.messenger import LarkMessenger

    fake = await FakeFeishu().start()
    out = LarkMessenger(_apps(fake))
    try:
        seed = fake._accept("seed", "ou_x", "{}", None)  # a message to answer under
        mid = await out.reply(fake.app_id, seed.message_id, "text", {"text": "hi"}, "evt_1")
        assert mid and fake.messages[mid].reply_to == seed.message_id
        assert await out.patch(fake.app_id, mid, {"elements": []})
        assert not await out.patch(fake.app_id, "om_missing/../x?y", {"elements": []})
        assert fake.requests[-1] == ("patch", "om_missing/../x?y", {"content": '{"elements": []}'})
        assert len(fake.connections) == 1
    finally:
        await out.aclose()
        await fake.stop()
