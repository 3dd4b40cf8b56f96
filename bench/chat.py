"""bench/chat: a chat message's way to its progress card and to its answer, against the fake Open Platform.

    .venv/bin/python -m bench.chat [--chats 1,10,50] [--apps 4] [--per-app 30] [--pg]

1. Latency: N concurrent chats (1, 10, 50) each send one signed, encrypted `im.message.receive_v1` to `amux up`
   (hub + in-process runner, the scripted profile); time from the webhook POST to the first progress card under
   the message, and to the card showing the answer: p50 / p99. Beside it, a bare aiohttp webhook that answers
   at once (one reply call to the same fake) gives the floor. Target: first card p99 ≤ 1 s at 1 chat on a quiet
   machine. Each person's message exists in the fake before its event is posted (the hub may reply under it at
   once). Feishu's own limit bounds this figure at 50 chats in one application: the channel sends at most 48
   calls a second per application (`bot/feishu/channel.Pacer`, under Feishu's 50), so 48 first cards go out in
   the first quarter second and the 49th and 50th when the first has left the one-second window.
2. Throughput: chats across several applications at once; chat outputs (cards, updates) per second in total and
   per application, the fake enforcing Feishu's limits (50 calls/s per application, 5 QPS per user): no 429
   (target 0) and no application above 50/s.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
from typing import Any

import httpx2
from aiohttp import web

from .common import figure, free_port, hub_process, pct, pg_database

EK, VT = "bench-encrypt-key", "bench-verification-token"


def _envelope(app_id: str, open_id: str, mid: str, text: str) -> bytes:
    from bot.feishu.webhook import encrypt

    now_ms = str(int(time.time() * 1000))
    event = {"sender": {"sender_id": {"open_id": open_id}, "sender_type": "user", "tenant_key": "t1"},
             "message": {"message_id": mid, "chat_id": f"oc_{open_id}", "chat_type": "p2p", "message_type": "text",
                         "content": json.dumps({"text": text}), "create_time": now_ms}}
    envelope = {"schema": "2.0", "header": {"event_id": uuid.uuid4().hex, "token": VT,
                                            "event_type": "im.message.receive_v1", "tenant_key": "t1",
                                            "app_id": app_id, "create_time": now_ms}, "event": event}
    return json.dumps({"encrypt": encrypt(json.dumps(envelope), EK, os.urandom(16))}).encode()


def _headers(body: bytes) -> dict[str, str]:
    from bot.feishu.webhook import signature

    ts, nonce = str(int(time.time())), uuid.uuid4().hex
    return {"Content-Type": "application/json", "X-Lark-Request-Timestamp": ts, "X-Lark-Request-Nonce": nonce,
            "X-Lark-Signature": signature(ts, nonce, EK, body)}


class Watch:
    """Record when the fake first accepted a reply under each message, and when that card first showed `done`."""

    def __init__(self, fake: Any) -> None:
        self.fake = fake
        self.first: dict[str, float] = {}
        self.final: dict[str, float] = {}
        self._task: asyncio.Task | None = None

    async def _run(self) -> None:
        while True:
            now = time.time()
            for m in list(self.fake.sent):
                if m.reply_to and m.reply_to not in self.first:
                    self.first[m.reply_to] = m.at
                if m.reply_to and m.reply_to not in self.final and m.updates and \
                        '"op": "stop"' not in json.dumps(m.updates[-1]):
                    self.final[m.reply_to] = now
            await asyncio.sleep(0.005)

    def __enter__(self) -> "Watch":
        self._task = asyncio.ensure_future(self._run())
        return self

    def __exit__(self, *exc: object) -> None:
        if self._task is not None:
            self._task.cancel()


async def _send(http: httpx2.AsyncClient, url: str, app_id: str, open_id: str, text: str,
                fake: Any = None) -> tuple[str, float]:
    """POST one message event; the person's message exists in `fake` before the hub can reply under it."""
    mid = f"om_{uuid.uuid4().hex[:12]}"
    if fake is not None:
        from tests.fakes.feishu import Message

        fake.messages.setdefault(mid, Message(message_id=mid, receive_id=None, uuid=None, content={}, at=time.time()))
    body = _envelope(app_id, open_id, mid, text)
    t0 = time.time()
    r = await http.post(f"{url}/feishu/{app_id}/events", content=body, headers=_headers(body))
    assert r.status_code == 200, r.text
    return mid, t0


async def _wait(watch: Watch, mids: list[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not all(m in watch.final for m in mids) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


async def bare_floor(fake: Any, app_id: str, chats: int) -> list[float]:
    """A bare aiohttp webhook that answers each message at once with one reply call: webhook → reply, seconds."""
    async with httpx2.AsyncClient() as feishu:
        token = (await feishu.post(f"{fake.base_url}/open-apis/auth/v3/tenant_access_token/internal",
                                   json={"app_id": app_id, "app_secret": "secret"})).json()["tenant_access_token"]

        async def handler(request: web.Request) -> web.Response:
            from bot.feishu.webhook import decrypt
            from tests.fakes.feishu import Message

            env = json.loads(decrypt((await request.json())["encrypt"], EK))
            mid = env["event"]["message"]["message_id"]
            fake.messages.setdefault(mid, Message(message_id=mid, receive_id=None, uuid=None, content={},
                                                  at=time.time()))
            await feishu.post(f"{fake.base_url}/open-apis/im/v1/messages/{mid}/reply",
                              headers={"Authorization": f"Bearer {token}"},
                              json={"msg_type": "text", "content": json.dumps({"text": "ok"}), "uuid": mid})
            return web.json_response({})

        app = web.Application()
        app.router.add_post("/feishu/{app_id}/events", handler)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with httpx2.AsyncClient(timeout=30) as http:
                sent = await asyncio.gather(*(_send(http, f"http://127.0.0.1:{port}", app_id, f"ou_bare{i}", "hi")
                                              for i in range(chats)))
            by = {m.reply_to: m.at for m in fake.sent if m.reply_to}
            return [by[mid] - t0 for mid, t0 in sent if mid in by]
        finally:
            await runner.cleanup()


async def latency(db_url: str | None, counts: list[int]) -> None:
    from tests.fakes.feishu import FakeFeishu

    app_id = f"cli_chatbench{free_port()}"
    fake = await FakeFeishu(app_id).start()
    apps = [{"app_id": app_id, "app_secret": "secret", "encrypt_key": EK, "verification_token": VT,
             "admin_open_id": "ou_admin", "base_url": fake.base_url, "profile": "scripted"}]
    env = {"AMUX_FEISHU__APPS": json.dumps(apps), "AMUX_HUB__POLL_S": "0.05", "AMUX_FEISHU__CHAT_UPDATE_S": "0.5"}
    store = "PostgreSQL" if db_url else "SQLite"
    try:
        async with hub_process(db_url, slots=64, env=env, profile_as=f"chat-{store.lower()}") as (url, _token), \
                httpx2.AsyncClient(timeout=60) as http:
            with Watch(fake) as watch:
                await _send(http, url, app_id, "ou_warm", "say warm")  # lark-oapi, the first claims: not measured
                await asyncio.sleep(3)
                for n in counts:
                    floor = await bare_floor(fake, app_id, n)
                    sent = await asyncio.gather(*(_send(http, url, app_id, f"ou_{n}_{i}", f"say answer {i}", fake)
                                                  for i in range(n)))
                    await _wait(watch, [m for m, _ in sent], 120)
                    first = [watch.first[m] - t for m, t in sent if m in watch.first]
                    final = [watch.final[m] - t for m, t in sent if m in watch.final]
                    f50, f99 = pct(first, 50), pct(first, 99)
                    figure(f"chat.{store.lower()}.first_card_p99.{n}", f"{store}, {n} chat(s): message → progress "
                           f"card p50 {f50 * 1000:.0f} ms / p99 {f99 * 1000:.0f} ms; → answer p50 "
                           f"{pct(final, 50) * 1000:.0f} ms / p99 {pct(final, 99) * 1000:.0f} ms "
                           f"({len(final)}/{n} answered); bare webhook p50 {pct(floor, 50) * 1000:.0f} ms",
                           value=f99 * 1000, unit="ms", floor=pct(floor, 99) * 1000, ratio=f99,
                           target="≤ 1.0" if n == 1 else None)
                    figure(f"chat.{store.lower()}.answer_p99.{n}", f"{store}, {n} chat(s): message → answer p99",
                           value=pct(final, 99) * 1000, unit="ms")
    finally:
        await fake.stop()


async def throughput(db_url: str | None, n_apps: int, per_app: int) -> None:
    from tests.fakes.feishu import FakeFeishu

    ids = [f"cli_chatrate{i}_{free_port()}" for i in range(n_apps)]
    fake = await FakeFeishu(ids[0], limits=True, more_apps={a: "secret" for a in ids[1:]}).start()
    apps = [{"app_id": a, "app_secret": "secret", "encrypt_key": EK, "verification_token": VT,
             "admin_open_id": "ou_admin", "base_url": fake.base_url, "profile": "scripted"} for a in ids]
    env = {"AMUX_FEISHU__APPS": json.dumps(apps), "AMUX_HUB__POLL_S": "0.05", "AMUX_FEISHU__CHAT_UPDATE_S": "0.5"}
    store = "PostgreSQL" if db_url else "SQLite"
    try:
        async with hub_process(db_url, slots=64, env=env) as (url, _token), httpx2.AsyncClient(timeout=60) as http:
            with Watch(fake) as watch:
                t0 = time.time()
                sent = await asyncio.gather(*(_send(http, url, a, f"ou_{i}", "tool Read 'a file'\nsay done", fake)
                                              for a in ids for i in range(per_app)))
                await _wait(watch, [m for m, _ in sent], 180)
                took = max([watch.final.get(m, time.time()) for m, _ in sent]) - t0
            outputs = len(fake.sent) + len(fake.patches)
            figure(f"chat.{store.lower()}.outputs_per_s", f"{store}, {n_apps} apps × {per_app} chats: {outputs} chat "
                   f"outputs in {took:.1f} s = {outputs / took:.1f}/s ({outputs / took / n_apps:.1f}/s per app, "
                   f"Feishu allows 50); {fake.rejected_429} answered 429; "
                   f"{len(watch.final)}/{len(sent)} answered", value=outputs / took, unit="outputs/s",
                   ratio=float(fake.rejected_429), target="≤ 0")
    finally:
        await fake.stop()


async def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.chat", description=__doc__.splitlines()[0])
    ap.add_argument("--chats", default="1,10,50")
    ap.add_argument("--apps", type=int, default=4)
    ap.add_argument("--per-app", type=int, default=30)
    ap.add_argument("--pg", action="store_true", help="also on PostgreSQL (AMUX_TEST_DATABASE_URL)")
    a = ap.parse_args(argv)
    counts = [int(x) for x in a.chats.split(",") if x]
    print("bench/chat: message → progress card → answer (scripted Turns, the fake Open Platform)", flush=True)
    await latency(None, counts)
    await throughput(None, a.apps, a.per_app)
    if a.pg:
        async with pg_database() as url:
            await latency(url, counts)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
