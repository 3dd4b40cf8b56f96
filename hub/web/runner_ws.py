"""`GET /runner/ws`: the hub's end of the runner protocol."""
from __future__ import annotations

import asyncio
import contextlib
import logging

from aiohttp import WSCloseCode, WSMsgType, web
from pydantic import ValidationError

from ..errors import AmuxError
from ..runner import protocol as p
from ..services.auth import AuthService
from ..services.runtimes import RuntimeService, TokenRevoked
from ..services.notify import Notifier

log = logging.getLogger("amux.runner_ws")
REVOKED_CLOSE = 4401  # application close code: the runner's token was revoked (the runner stops; no retry helps)


INBOX_FRAMES = 1024      # frames read ahead of the applier before the socket stops being read
APPLY_ATTEMPTS = 3       # tries of one batch before the socket is closed for the runner to reconnect and resend


class RunnerEndpoint:
    """Accept runner connections; one pump per connection sends dispatches and cancels."""

    def __init__(self, auth: AuthService, runtimes: RuntimeService, notifier: Notifier,
                 heartbeat_s: float, poll_s: float, hello_timeout_s: float = 5.0) -> None:
        self.auth = auth
        self.hello_timeout_s = hello_timeout_s  # an upgraded socket that says nothing is closed after this
        self.runtimes = runtimes
        self.notifier = notifier
        self.heartbeat_s = heartbeat_s
        self.poll_s = poll_s
        self.open: set[web.WebSocketResponse] = set()
        self.by_token: dict[str, set[web.WebSocketResponse]] = {}
        # A revocation through this replica closes at once; other replicas' pumps see it in the database.
        auth.revocation_listeners.append(self._on_revoked)

    def _on_revoked(self, token_id: str) -> None:
        for ws in list(self.by_token.get(token_id, ())):
            asyncio.ensure_future(self._close_revoked(ws))

    @staticmethod
    async def _close_revoked(ws: web.WebSocketResponse) -> None:
        with contextlib.suppress(Exception):
            await ws.send_json(p.ErrorMsg(message="this runner's token was revoked; create a new one with "
                                                  "`amux token create --runner`", code="token_revoked").model_dump())
        await ws.close(code=REVOKED_CLOSE, message=b"token revoked")

    async def close_all(self, _app: web.Application | None = None) -> None:
        """Close every runner connection (on shutdown): runners reconnect to another replica or a restarted hub."""
        for ws in list(self.open):
            await ws.close(code=WSCloseCode.GOING_AWAY, message=b"hub shutting down")

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Authenticate, register, then serve messages until the runner goes away."""
        try:
            caller = await self.auth.authenticate(request.headers.get("Authorization"), surface="runner",
                                                 fresh=True)
        except AmuxError as e:
            return web.json_response({"error": e.code, "message": e.message}, status=e.status)
        ws = web.WebSocketResponse(heartbeat=30, max_msg_size=16 * 1024 * 1024)
        await ws.prepare(request)
        try:
            first = await ws.receive_json(timeout=self.hello_timeout_s)
            reg = p.Register.model_validate(first)
            runtime_id, conn_id, drop = await self.runtimes.register(caller, reg)
        except (AmuxError, ValidationError, ValueError, TypeError, asyncio.TimeoutError) as e:
            msg = e.message if isinstance(e, AmuxError) else f"bad register message ({e}); upgrade the runner to this hub's version"
            code = e.code if isinstance(e, AmuxError) else "invalid"
            await ws.send_json(p.ErrorMsg(message=msg, code=code).model_dump())
            await ws.close()
            return ws
        except Exception as e:  # the database, most likely: the socket is already upgraded, so answer in-protocol
            log.warning("runner registration failed (%s); the runner will retry", type(e).__name__)
            with contextlib.suppress(Exception):
                await ws.send_json(p.ErrorMsg(message="the hub could not register this runner just now; retrying",
                                              code="retry").model_dump())
            await ws.close(code=WSCloseCode.INTERNAL_ERROR, message=b"retry")
            return ws
        await ws.send_json(p.Registered(runtime_id=runtime_id, heartbeat_s=self.heartbeat_s, drop=drop).model_dump())
        pump = asyncio.create_task(self._pump(ws, runtime_id, conn_id, caller.token_id))
        inbox: asyncio.Queue = asyncio.Queue(maxsize=INBOX_FRAMES)  # full: stop reading, the runner waits
        applier = asyncio.create_task(self._apply_loop(ws, runtime_id, conn_id, inbox))
        self.open.add(ws)
        self.by_token.setdefault(caller.token_id, set()).add(ws)
        try:
            async for raw in ws:
                if raw.type != WSMsgType.TEXT:
                    break
                if applier.done():  # it could not apply reports and closed the socket: stop reading
                    break
                await inbox.put(raw.json())
            if not applier.done():
                await inbox.put(None)
                await applier  # apply what arrived before the connection closed
        finally:
            self.open.discard(ws)
            peers = self.by_token.get(caller.token_id, set())
            peers.discard(ws)
            if not peers:
                self.by_token.pop(caller.token_id, None)
            for task in (pump, applier):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            with contextlib.suppress(Exception):
                await self.runtimes.disconnected(runtime_id, conn_id)
        return ws

    async def _apply_loop(self, ws: web.WebSocketResponse, runtime_id: str, conn_id: str, inbox: asyncio.Queue) -> None:
        """Group commit: every frame that arrived while the last transaction ran is applied in the next one, in order."""
        while True:
            frames = [await inbox.get()]
            while not inbox.empty():
                frames.append(inbox.get_nowait())
            done = frames[-1] is None
            frames = [f for f in frames if f is not None]
            if frames:
                batch = {"type": "batch", "messages": [
                    m for f in frames for m in (f.get("messages", []) if f.get("type") == "batch" else [f])]}
                for attempt in range(APPLY_ATTEMPTS):
                    try:
                        await self._on_message(ws, runtime_id, conn_id, batch)
                        break
                    except (ConnectionError, RuntimeError):
                        return  # the socket is gone
                    except Exception as e:  # a transient database error (deadlock, restart): retry, then hand back
                        if attempt + 1 < APPLY_ATTEMPTS:
                            await asyncio.sleep(0.2 * 2 ** attempt)
                            continue
                        # The runner keeps what was not acknowledged and resends it after reconnecting (to this
                        # replica or another), so closing loses nothing; a silent dead applier would lose it all.
                        log.warning("could not apply a runner's reports (%s); closing its socket so it reconnects",
                                    type(e).__name__)
                        await ws.close(code=WSCloseCode.INTERNAL_ERROR, message=b"reconnect")
                        return
            if done:
                return

    async def _pump(self, ws: web.WebSocketResponse, runtime_id: str, conn_id: str, token_id: str) -> None:
        """Send what is due; each round re-verifies the token in the database, so a revocation made on any
        replica closes this socket within one poll interval and nothing is dispatched after it."""
        cancels_sent: set[str] = set()
        while not ws.closed:
            try:
                for msg in await self.runtimes.outgoing(runtime_id, conn_id, cancels_sent, token_id):
                    await ws.send_json(msg)
            except TokenRevoked:
                await self._close_revoked(ws)
                return
            except (ConnectionError, RuntimeError):
                return
            except Exception:
                log.exception("runner pump failed")
            await self.notifier.wait(f"runtime:{runtime_id}", self.poll_s)

    async def _on_message(self, ws: web.WebSocketResponse, runtime_id: str, conn_id: str, msg: dict) -> None:
        """Apply one frame (a message or a `batch` of them) in one transaction; answer with one frame."""
        frames = msg.get("messages") if msg.get("type") == "batch" else [msg]
        parsed = []
        errors = []
        for frame in frames if isinstance(frames, list) else []:
            model = p.RUNNER_MESSAGES.get(frame.get("type") if isinstance(frame, dict) else None)
            if model is None or model is p.Register:
                errors.append(p.ErrorMsg(message=f"unknown message type {frame.get('type') if isinstance(frame, dict) else frame!r}; upgrade the runner").model_dump())
                continue
            try:
                parsed.append(model.model_validate(frame))
            except ValidationError as e:
                errors.append(p.ErrorMsg(message=f"malformed {frame.get('type')} message: {e.errors()[0]['msg']}; upgrade the runner").model_dump())
        replies = (await self.runtimes.apply(runtime_id, conn_id, parsed) if parsed else []) + errors
        if replies:
            await ws.send_json(replies[0] if len(replies) == 1 else {"type": "batch", "messages": replies})
