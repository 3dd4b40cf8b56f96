"""`GET /runner/ws`: the hub's end of the runner protocol."""
from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from datetime import datetime
from types import SimpleNamespace
from typing import Callable, Collection

from aiohttp import WSCloseCode, WSMsgType, web
from pydantic import BaseModel, ValidationError

from .. import logs
from ..domain.text import BadText, loads_bounded
from ..errors import AmuxError
from ..loops import Background, Loops
from ..runner import protocol as p
from ..services.auth.service import AuthService
from ..services.notify import Notifier
from ..services.tasks.dispatch import Link, Outbound, RunnerDispatch
from ..services.tasks.registry import RuntimeRegistry
from ..services.tasks.reports import RunnerReports
from ..store.db import Connection, Row

log = logging.getLogger("amux.runner_ws")
# A runner that misses this many heartbeats in a row is offline: placement never chooses it (it reconnects).
SILENT_HEARTBEATS = 3
REVOKED_CLOSE = 4401  # application close code: the runner's token was revoked (the runner stops; no retry helps)


INBOX_FRAMES = 1024      # frames read ahead of the applier before the socket stops being read
APPLY_ATTEMPTS = 3       # tries of one batch before the socket is closed for the runner to reconnect and resend
PUMP_LOOP = "runner-pump"
SEND_TIMEOUT_S = 15.0    # a socket that takes longer to take one message is closed (the runner reconnects)
_REVOKE = object()       # in a socket's outbox: say the token was revoked, then close
_RECONNECT = object()    # in a socket's outbox: close it so that the runner registers again


@dataclass(kw_only=True, eq=False)
class _Socket:
    """One runner connection this replica serves: the socket, what the pump knows of it, what it still sends."""

    ws: web.WebSocketResponse
    link: Link
    outbox: asyncio.Queue = field(default_factory=asyncio.Queue)
    closing: bool = False  # revoked or stale: the pump serves it no more


class RunnerEndpoint:
    """Accept runner connections; one pump per replica reads what every connection is due and hands it over."""

    def __init__(self, auth: AuthService, registry: RuntimeRegistry, reports: RunnerReports,
                 runner_dispatch: RunnerDispatch, notifier: Notifier,
                 heartbeat_s: float, poll_s: float, hello_timeout_s: float = 5.0, *,
                 loops: Loops | None = None) -> None:
        self.auth = auth
        self.hello_timeout_s = hello_timeout_s  # an upgraded socket that says nothing is closed after this
        self.registry = registry
        self.reports = reports
        self.runner_dispatch = runner_dispatch
        self.notifier = notifier
        self.heartbeat_s = heartbeat_s
        self.poll_s = poll_s
        self.open: set[web.WebSocketResponse] = set()
        self.by_token: dict[str, set[web.WebSocketResponse]] = {}
        self.sockets: dict[str, _Socket] = {}  # connection id -> what the pump serves
        self.loops = loops if loops is not None else Loops()
        self._own_loops = loops is None
        self.wake = asyncio.Event()
        self.background = Background("runner endpoint")  # closes of revoked sockets, held until they end
        # A revocation through this replica closes at once; other replicas' pumps see it in the database.
        auth.revocation_listeners.append(self._on_revoked)
        # Work admitted on this replica for a runtime it serves wakes the pump at once; the rest waits a poll.
        notifier.listen("runtime:", self._on_runtime_notified)

    def _on_runtime_notified(self, key: str) -> None:
        runtime_id = key.removeprefix("runtime:")
        if any(s.link.runtime_id == runtime_id for s in self.sockets.values()):
            self.wake.set()

    def _on_revoked(self, token_id: str) -> None:
        for ws in list(self.by_token.get(token_id, ())):
            self.background.spawn(self._close_revoked(ws))

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
        await self.background.aclose()
        if self._own_loops:
            await self.loops.stop()

    def _ensure_pump(self) -> None:
        """Start the replica's pump with its first runner connection (a replica without runners runs none)."""
        state = self.loops.loops.get(PUMP_LOOP)
        if state is None or state.stopped:
            self.loops.start(PUMP_LOOP, self.pump_step, interval_s=self.poll_s, wake=self.wake)

    async def pump_step(self) -> None:
        """One round for every connection of this replica: read what each is due in one transaction (dispatches,
        cancels, permission answers, steers; the token re-verified, so a revocation made on any replica closes
        the socket within one poll interval and nothing is dispatched after it) and queue it on each socket."""
        serving = [s for s in self.sockets.values() if not s.closing and not s.ws.closed]
        if not serving:
            return
        due = await self.runner_dispatch.outgoing_many([s.link for s in serving])
        self._deliver(serving, due)

    def _open_on(self, runtime_ids: Collection[str]) -> list[_Socket]:
        return [s for s in self.sockets.values() if s.link.runtime_id in runtime_ids and not s.closing
                and not s.ws.closed]

    async def serving(self, conn: Connection, runtimes: dict[str, Row]) -> set[str]:
        """Placement's hand-off (`dispatch.HandOff`): those of these runtimes a live socket of this replica serves."""
        socks = self._open_on(runtimes)
        if not socks:
            return set()
        current = {rt: (r.connection_id, r.capabilities) for rt, r in runtimes.items()}
        return set(await self.runner_dispatch.served(conn, [s.link for s in socks], current))

    async def dispatch(self, conn: Connection, now: datetime, runs: list[SimpleNamespace]) -> Callable[[], None]:
        """Placement's hand-off (`dispatch.HandOff`): build these runs' dispatches in placement's transaction; return
        what queues them on their sockets once it has committed."""
        socks = {s.link.runtime_id: s for s in self._open_on({r.runtime_id for r in runs})}
        built = await self.runner_dispatch.dispatch_messages(conn, runs, {r.runtime_id: r.capabilities for r in runs},
                                                             now, fresh=True)
        by_runtime: dict[str, list[dict]] = {}
        for runtime_id, msg in built:
            by_runtime.setdefault(runtime_id, []).append(msg)

        def send() -> None:
            for runtime_id, msgs in by_runtime.items():
                sock = socks.get(runtime_id)
                if sock is not None and not sock.closing:  # gone meanwhile: its runner gets it again on reconnecting
                    sock.outbox.put_nowait(msgs)

        return send

    def _deliver(self, serving: list[_Socket], due: Outbound) -> None:
        """Queue a committed claim's messages on their sockets; close the revoked and the stale."""
        for s in serving:
            if s.link.conn_id in due.revoked:
                s.closing = True
                s.outbox.put_nowait(_REVOKE)
            elif s.link.conn_id in due.stale:
                # Marked lost (its heartbeats went unapplied) or registered again elsewhere: whatever this socket
                # carries is ignored now, so close it; the runner registers again and resends what is unacknowledged.
                s.closing = True
                s.outbox.put_nowait(_RECONNECT)
            elif msgs := due.messages.get(s.link.conn_id):
                s.outbox.put_nowait(msgs)

    async def _send_loop(self, s: _Socket) -> None:
        """Send what the pump queued for this socket, in order; a socket that cannot take it is closed."""
        while True:
            item = await s.outbox.get()
            if item is _REVOKE:
                await self._close_revoked(s.ws)
                return
            if item is _RECONNECT:
                log.warning("runtime %s's connection is no longer current (lost or registered again); closing it so "
                            "the runner registers again", s.link.runtime_id)
                await s.ws.close(code=WSCloseCode.TRY_AGAIN_LATER, message=b"reconnect")
                return
            try:
                for msg in item:
                    await asyncio.wait_for(s.ws.send_json(msg), SEND_TIMEOUT_S)
            except (ConnectionError, RuntimeError):
                # The socket is gone; what it did not take is sent again on the runner's next connection.
                with contextlib.suppress(Exception):
                    await s.ws.close(code=WSCloseCode.TRY_AGAIN_LATER, message=b"reconnect")
                return
            except asyncio.TimeoutError:
                log.warning("a runner's socket took no message for %.0fs; closing it so it reconnects",
                            SEND_TIMEOUT_S)
                with contextlib.suppress(Exception):
                    await s.ws.close(code=WSCloseCode.TRY_AGAIN_LATER, message=b"reconnect")
                return

    async def handle(self, request: web.Request) -> web.StreamResponse:
        """Authenticate, register, then serve messages until the runner goes away."""
        try:
            caller = await self.auth.authenticate(request.headers.get("Authorization"), surface="runner",
                                                 fresh=True)
            logs.note_caller(caller.principal, caller.label)
        except AmuxError as e:
            return web.json_response({"error": e.code, "message": e.message}, status=e.status)
        ws = web.WebSocketResponse(heartbeat=30, max_msg_size=16 * 1024 * 1024)
        await ws.prepare(request)
        try:
            first = await ws.receive_json(loads=loads_bounded, timeout=self.hello_timeout_s)
            reg = p.Register.model_validate(first)
            runtime_id, conn_id, drop = await self.registry.register(caller, reg)
        except (AmuxError, ValidationError, ValueError, TypeError, asyncio.TimeoutError) as e:
            msg = (e.message if isinstance(e, AmuxError)
                   else f"bad register message ({e}); upgrade the runner to this hub's version")
            code = e.code if isinstance(e, AmuxError) else "invalid"
            await ws.send_json(p.ErrorMsg(message=msg, code=code).model_dump())
            await ws.close()
            return ws
        except Exception as e:  # noqa: BLE001 — the database, most likely: the socket is upgraded, answer in-protocol
            log.warning("runner registration failed (%s); the runner will retry", type(e).__name__)
            with contextlib.suppress(Exception):
                await ws.send_json(p.ErrorMsg(message="the hub could not register this runner just now; retrying",
                                              code="retry").model_dump())
            await ws.close(code=WSCloseCode.INTERNAL_ERROR, message=b"retry")
            return ws
        await ws.send_json(p.Registered(runtime_id=runtime_id, heartbeat_s=self.heartbeat_s, drop=drop).model_dump())
        sock = _Socket(ws=ws, link=Link(runtime_id=runtime_id, conn_id=conn_id, token_id=caller.token_id))
        sender = asyncio.create_task(self._send_loop(sock))
        self.sockets[conn_id] = sock
        self._ensure_pump()
        self.wake.set()  # what registration put back to send (and what queued meanwhile) goes at once
        inbox: asyncio.Queue = asyncio.Queue(maxsize=INBOX_FRAMES)  # full: stop reading, the runner waits
        applier = asyncio.create_task(self._apply_loop(ws, runtime_id, conn_id, inbox))
        self.open.add(ws)
        self.by_token.setdefault(caller.token_id, set()).add(ws)
        silence_s = SILENT_HEARTBEATS * self.heartbeat_s
        try:
            while True:
                try:
                    raw = await ws.receive(timeout=silence_s)
                except asyncio.TimeoutError:  # frozen or cut off: offline now, so placement passes it by
                    log.info("runner of runtime %s sent nothing for %.0fs (%d heartbeats); closing its connection",
                             runtime_id, silence_s, SILENT_HEARTBEATS)
                    await ws.close(code=WSCloseCode.GOING_AWAY, message=b"silent")
                    break
                if raw.type != WSMsgType.TEXT:
                    break
                if applier.done():  # it could not apply reports and closed the socket: stop reading
                    break
                try:
                    frame = raw.json(loads=loads_bounded)
                except BadText as e:  # not JSON, or nested past the edge's depth: the runner is not ours
                    await ws.send_json(p.ErrorMsg(message=f"{e}; upgrade the runner").model_dump())
                    break
                await inbox.put(frame)
            if not applier.done():
                await inbox.put(None)
                await applier  # apply what arrived before the connection closed
        finally:
            self.sockets.pop(conn_id, None)
            self.open.discard(ws)
            peers = self.by_token.get(caller.token_id, set())
            peers.discard(ws)
            if not peers:
                self.by_token.pop(caller.token_id, None)
            for task in (sender, applier):
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            with contextlib.suppress(Exception):
                await self.registry.disconnected(runtime_id, conn_id)
        return ws

    async def _apply_loop(self, ws: web.WebSocketResponse, runtime_id: str, conn_id: str, inbox: asyncio.Queue) -> None:
        """Group commit: every frame that arrived while the last transaction ran is applied in the next one, in
        order."""
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
                    except Exception as e:  # noqa: BLE001 — a transient database error (deadlock, restart): retry
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

    async def _on_message(self, ws: web.WebSocketResponse, runtime_id: str, conn_id: str, msg: dict) -> None:
        """Apply one frame (a message or a `batch` of them) in one transaction; answer with one frame."""
        frames = msg.get("messages") if msg.get("type") == "batch" else [msg]
        parsed: list[BaseModel] = []
        errors = []
        for frame in frames if isinstance(frames, list) else []:
            model = p.RUNNER_MESSAGES.get(frame.get("type") if isinstance(frame, dict) else None)
            if model is None or model is p.Register:
                kind = frame.get('type') if isinstance(frame, dict) else frame
                errors.append(p.ErrorMsg(message=f"unknown message type {kind!r}; upgrade the runner").model_dump())
                continue
            try:
                parsed.append(model.model_validate(frame))
            except ValidationError as e:
                why = e.errors()[0]['msg']
                errors.append(p.ErrorMsg(message=f"malformed {frame.get('type')} message: {why}; upgrade the runner")
                              .model_dump())
        replies = (await self.reports.apply(runtime_id, conn_id, parsed) if parsed else []) + errors
        if replies:
            await ws.send_json(replies[0] if len(replies) == 1 else {"type": "batch", "messages": replies})
