"""A fake of Feishu's long-connection endpoint: hands lark-oapi's ws client a URL, keeps each connection it
opens, pushes event frames down it and records the answers (the SDK's protobuf frames, as the platform sends)."""
from __future__ import annotations

import asyncio
import base64
import itertools
import json
from dataclasses import dataclass, field
from typing import Any

from aiohttp import WSMsgType, web
from lark_oapi.ws.pb.pbbp2_pb2 import Frame


@dataclass
class WsConnection:
    """One client connection: which application asked for it, whether it is open, what it answered."""

    number: int
    app_id: str
    ws: web.WebSocketResponse = field(repr=False)
    open: bool = True
    answers: dict[str, dict] = field(default_factory=dict)   # message id → the client's answer (decoded)
    answered: asyncio.Event = field(default_factory=asyncio.Event, repr=False)


class FakeFeishuWs:
    """`POST /callback/ws/endpoint` and the websocket it points to."""

    def __init__(self) -> None:
        self.connections: list[WsConnection] = []
        self._pending: dict[str, str] = {}   # device id → app id (from the endpoint call)
        self._ids = itertools.count(1)
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    async def start(self, port: int = 0) -> "FakeFeishuWs":
        """Serve on 127.0.0.1."""
        app = web.Application()
        app.router.add_post("/callback/ws/endpoint", self._endpoint)
        app.router.add_get("/ws", self._ws)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.base_url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        return self

    async def stop(self) -> None:
        """Close every connection and stop serving."""
        for c in self.connections:
            if c.open:
                await c.ws.close()
        if self._runner is not None:
            await self._runner.cleanup()

    def open(self, app_id: str | None = None) -> list[WsConnection]:
        """The connections still open (of `app_id`)."""
        return [c for c in self.connections if c.open and (app_id is None or c.app_id == app_id)]

    async def _endpoint(self, request: web.Request) -> web.Response:
        body = await request.json()
        device = f"d{next(self._ids)}"
        self._pending[device] = body.get("AppID", "")
        url = self.base_url.replace("http://", "ws://") + f"/ws?device_id={device}&service_id=1"
        return web.json_response({"code": 0, "msg": "ok", "data": {"URL": url, "ClientConfig": {
            "ReconnectCount": -1, "ReconnectInterval": 1, "ReconnectNonce": 0, "PingInterval": 120}}})

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        conn = WsConnection(len(self.connections) + 1, self._pending.pop(request.query.get("device_id", ""), ""), ws)
        self.connections.append(conn)
        try:
            async for msg in ws:
                if msg.type != WSMsgType.BINARY:
                    continue
                frame = Frame()
                frame.ParseFromString(msg.data)
                headers = {h.key: h.value for h in frame.headers}
                if headers.get("type") == "event" and frame.method == 1:
                    answer = json.loads(frame.payload)
                    if answer.get("data"):
                        answer["data"] = json.loads(base64.b64decode(answer["data"]))
                    conn.answers[headers.get("message_id", "")] = answer
                    conn.answered.set()
        finally:
            conn.open = False
        return ws

    async def push_event(self, conn: WsConnection, message_id: str, envelope: dict[str, Any]) -> None:
        """Send one EVENT data frame carrying `envelope` (a schema 2.0 event) down `conn`."""
        frame = Frame(SeqID=0, LogID=0, service=1, method=1, payload=json.dumps(envelope).encode())
        for key, value in (("type", "event"), ("message_id", message_id), ("trace_id", f"t-{message_id}"),
                           ("sum", "1"), ("seq", "0")):
            h = frame.headers.add()
            h.key, h.value = key, value
        await conn.ws.send_bytes(frame.SerializeToString())

    async def answer(self, conn: WsConnection, message_id: str, timeout: float = 10.0) -> dict:
        """Wait for the client's answer to `message_id`."""
        async def got() -> dict:
            while message_id not in conn.answers:
                conn.answered.clear()
                await conn.answered.wait()
            return conn.answers[message_id]

        return await asyncio.wait_for(got(), timeout)
