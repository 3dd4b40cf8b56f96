"""Composition root: the only module that wires concrete adapters together."""
from __future__ import annotations

import asyncio
import logging
import secrets
from pathlib import Path
from typing import Any, AsyncIterator

from aiohttp import web

from .boxes.local import LocalBoxDriver
from .clock import Clock, SystemClock
from .errors import AmuxError
from .config import Settings
from .files import private_dir, write_private
from . import logs
from .loops import Loops
from .mcp.instance_tools import instance_tools
from .mcp.lease_tools import lease_tools
from .mcp.schedule_tools import schedule_tools
from .mcp.server import build_mcp
from .mcp.session_tools import session_tools
from .mcp.task_tools import task_tools
from .services.tasks.admission import Admission
from .services.alerts.service import AlertService
from .services.alerts.channel import ConsoleChannel, load_channel
from .services.auth.service import AuthService
from .services.chat.bot import BotService
from .services.auth.oauth import OAuthService
from .services.auth.oauth_registration import ClientRegistration
from .services.auth.credentials import CredentialService, SecretBox
from .services.tasks.profiles import ProfileService
from .services.tasks.dispatch import Dispatcher
from .services.leases.service import LeaseService
from .services.notify import Notifier
from .services.chat.turns import ChatTurnService
from .services.tasks.dispatch import RunnerDispatch
from .services.alerts.outbox import OutboxWorker
from .services.tasks.registry import RuntimeRegistry
from .services.tasks.reports import RunnerReports
from .services.schedules.firing import ScheduleFiring
from .services.schedules.results import ScheduleResults
from .services.schedules.service import ScheduleService
from .services.schedules.recovery import RecoveryService
from .services.sessions.instances import InstanceService
from .services.sessions.memory import MemoryService
from .services.tasks.health import HealthService
from .services.auth.identity import IdentityService
from .services.sessions.service import SessionService
from .services.tasks.service import PermissionService, TaskService
from .services.leases.box_sessions import BoxSessionService
from .services.tasks.timeline import TimelineService
from .store.db import Database
from .store.keys import shared_key
from .web import boxes, edge, health, rest, schedules_api
from .web import alerts_api
from .web import identity_api
from .web import instances_api, sessions_api
from .web import timeline_api, timeline_page
from .web import openapi
from .web import oauth as oauth_web
from .web.mcp_mount import McpMount
from .web.server import ConnectionLimits, GuardedAppRunner, listen_address, url_of
from .web.runner_ws import RunnerEndpoint



def embedded_secret_key(home: Path) -> str:
    """Return the embedded hub's credential key from `$AMUX_HOME/secret.key`, creating it (mode 0600)."""
    path = home / "secret.key"
    private_dir(home)
    if not path.exists():
        write_private(path, secrets.token_urlsafe(32) + "\n")
    elif path.stat().st_mode & 0o077:
        path.chmod(0o600)
    return path.read_text().strip()


class Hub:
    """Every service of one hub replica, built over one database and one clock."""

    def __init__(self, settings: Settings, db: Database | None = None, clock: Clock | None = None) -> None:
        self.settings = settings
        self.db = db or Database(settings.db_url())
        self.clock = clock or SystemClock()
        self.notifier = Notifier()
        self.metrics = health.Metrics()
        self.metrics_url: str | None = None  # `http://HOST:PORT/metrics` once hub.metrics_listen is served
        self.loops = Loops(self.metrics.registry)
        hs = settings.hub
        self.oauth = OAuthService(self.db, self.clock)  # hosted MCP clients
        self.registration = ClientRegistration(self.oauth, self.clock, settings.oauth)  # limited, pruned
        self.auth = AuthService(self.db, self.clock, oauth=self.oauth)
        self.dispatcher = Dispatcher(self.db, self.clock, self.notifier, hs, execution=settings.execution)
        self.profiles = ProfileService(self.db, self.clock)
        key = settings.secret_key or (embedded_secret_key(settings.home) if self.db.is_sqlite else None)
        self.credentials = CredentialService(self.db, self.clock, SecretBox(key) if key else None)
        self.admission = Admission(self.profiles, self.credentials, hs, settings.profiles, clock=self.clock)
        self.tasks = TaskService(self.db, self.clock, self.notifier, hs, self.admission,
                                 on_admitted=self.dispatcher.kick, execution=settings.execution)
        self.permissions = PermissionService(self.db, self.clock, self.notifier)
        self.timeline = TimelineService(self.db, self.clock, settings.timeline)
        self.sessions = SessionService(self.db, self.clock, self.notifier, self.admission, self.tasks,
                                       on_admitted=self.dispatcher.kick, user_isolation=settings.memory.user_isolation)
        self.memory = MemoryService(self.db, self.clock, settings.memory)
        self.instances = InstanceService(self.db, self.clock, self.notifier, self.sessions, self.tasks,
                                         on_admitted=self.dispatcher.kick)
        self.registry = RuntimeRegistry(self.db, self.clock, self.dispatcher, execution=settings.execution,
                                        reap_s=settings.hub.runtime_reap_s)
        self.reports = RunnerReports(self.db, self.clock, self.notifier, self.dispatcher, self.auth,
                                     on_started=lambda _t, s: self.metrics.dispatch_latency.observe(max(s, 0.0)))
        self.runner_dispatch = RunnerDispatch(self.db, self.clock, self.credentials, self.auth,
                                              settings.public_url or f"http://{settings.listen}")
        self.runner_endpoint = RunnerEndpoint(self.auth, self.registry, self.reports, self.runner_dispatch,
                                              self.notifier, hs.heartbeat_s, hs.poll_s, hs.hello_timeout_s,
                                              loops=self.loops)
        self.dispatcher.hand_off = self.runner_endpoint
        self.leases = LeaseService(self.db, self.clock, settings.leases,
                                   LocalBoxDriver(settings.home / "boxes", settings.boxes, hide=[settings.home]),
                                   settings.boxes)
        # SessionService fills the schedules' SessionPort seam (hub/services/schedules/ports.py).
        # A definition change wakes the firing loop; the event exists before both ends of it.
        firing_wake = asyncio.Event()
        self.schedules = ScheduleService(self.db, self.clock, settings.schedules, self.admission, self.sessions,
                                         on_changed=firing_wake.set, feishu=settings.feishu)
        self.recovery = RecoveryService(self.db, self.clock)  # upgrade creator recovery
        self.identity = IdentityService(self.db, self.clock)  # Feishu identity links
        # The Feishu channel, wired here: configured apps load it (a missing lark-oapi fails the start, naming
        # the fix); no apps is the explicit ConsoleChannel: the console's own application's notices are confirmed
        # where the console reads them, any other application's have no channel to go to.
        channel = (load_channel(settings.feishu.channel, settings) if settings.feishu.apps else ConsoleChannel(
            "no Feishu application is configured ([[feishu.apps]]): status notices have no channel to go to"))
        self.alerts = AlertService(self.db, self.clock, settings.alerts, settings.feishu, channel, self.schedules)
        # Reconciled firing outcomes feed the alert pipeline (its OutcomeSink).
        self.schedule_firing = ScheduleFiring(self.db, self.clock, settings.schedules, self.admission,
                                              self.tasks.queue, self.sessions,
                                              sink=self.alerts, on_admitted=self.dispatcher.kick, kicked=firing_wake,
                                              tasks=self.tasks)
        self.schedules.firing = self.schedule_firing  # schedule_run_now fires through the loop's own code
        registrars = [task_tools(self.tasks, self.profiles, self.permissions, self.timeline),
                      instance_tools(self.instances),
                      lease_tools(self.leases), session_tools(self.sessions)]
        registrars.append(schedule_tools(self.schedules))
        self.mcp = McpMount(build_mcp(registrars), self.auth)
        # The Feishu bot: the composition root may import bot; hub modules never do.
        from bot.app import build_bot
        from bot.services import BotServices
        self.bot_state = BotService(self.db, self.clock, self.sessions)
        from bot.cards.chat import ChatCardRenderer
        from bot.i18n import catalogs
        self.chats = ChatTurnService(self.db, self.clock, self.notifier, self.sessions, ChatCardRenderer(catalogs()),
                                     update_s=settings.feishu.chat_update_s,
                                     steer_wait_s=settings.feishu.chat_steer_wait_s, poll_s=hs.poll_s)
        # Chat outputs have their own outbox worker (and loop), woken by the chat flow: the person is waiting.
        self.chat_outbox = OutboxWorker(self.db, self.clock, settings.alerts, self.alerts.n, channel,
                                        f"{self.alerts.worker.worker_id}:chat")
        self.bot_services = BotServices(
            clock=self.clock, feishu=settings.feishu, public_url=settings.public_url, auth=self.auth, oauth=self.oauth,
            identity=self.identity, sessions=self.sessions, schedules=self.schedules,
            results=ScheduleResults(self.db, self.schedules), alerts=self.alerts,
            runner_dispatch=self.runner_dispatch, state=self.bot_state, chats=self.chats,
            directory=self._directory(settings),
            timeline=self.timeline)
        self.bot = build_bot(self.bot_services)

    @staticmethod
    def _directory(settings: Settings) -> Any:
        """Feishu users' display names for the bot's greetings (no Feishu apps: none)."""
        if not settings.feishu.apps:
            return None
        from bot.feishu.directory import FeishuDirectory

        return FeishuDirectory(settings.feishu.apps, timeout_s=min(1.5, settings.feishu.timeout_s))

    def web_app(self, *, background: bool = True) -> web.Application:
        """Build the aiohttp application; `background` starts the placement and reaper loops."""
        app = web.Application(middlewares=[edge.edge_middleware(self.settings.hub.body_timeout_s,
                                                                 self.settings.hub.trusted_proxies),
                                             rest.auth_middleware(self.auth)], client_max_size=2 * 1024 * 1024)
        health.add_routes(app, HealthService(self.db), self.metrics, self.loops,
                          health.MetricsDoor(self.auth, self.settings.hub.metrics_token))
        rest.add_routes(app, rest.RestServices(
            auth=self.auth, tasks=self.tasks, permissions=self.permissions, sessions=self.sessions,
            profiles=self.profiles, credentials=self.credentials, memory=self.memory, registry=self.registry))
        schedules_api.add_routes(app, self.schedules)
        alerts_api.add_routes(app, self.alerts)
        identity_api.add_routes(app, self.identity)
        sessions_api.add_routes(app, self.sessions)
        instances_api.add_routes(app, self.instances)
        timeline_api.add_routes(app, self.timeline)
        openapi.add_routes(app)
        app.router.add_get("/runner/ws", self.runner_endpoint.handle)
        app.on_shutdown.append(self.runner_endpoint.close_all)
        app.router.add_route("*", "/mcp", self.mcp.handle)
        oauth_web.add_routes(app, self.oauth, self.auth, self.settings.public_url, self.registration)
        boxes.add_routes(app, self.auth, self.leases, self.clock, public_url=self.settings.public_url)
        timeline_page.add_routes(app, self.auth, self.oauth, self.timeline, BoxSessionService(self.db, self.clock),
                                 public_url=self.settings.public_url)
        self.bot.add_routes(app)
        app.cleanup_ctx.insert(0, self._resources_ctx)  # cleaned up last: after the loops and the bot stopped
        app.cleanup_ctx.append(self.bot.lifespan)
        app.cleanup_ctx.append(self._mcp_ctx)
        if self.settings.hub.metrics_listen:
            app.cleanup_ctx.append(self._metrics_listen_ctx)
        if background:
            app.cleanup_ctx.append(self._loops_ctx)
        return app

    def app_runner(self, *, background: bool = True) -> GuardedAppRunner:
        """The aiohttp runner for this hub's app, with the slow- and idle-client limits of `hub.*`."""
        return GuardedAppRunner(self.web_app(background=background), self._limits(), self.clock,
                                **self._access_log())

    def _access_log(self) -> dict[str, object]:
        """One access line per request (hub/logs.py), unless `log.access` is off."""
        if not self.settings.log.access:
            return {"access_log": None}
        return {"access_log": logging.getLogger(logs.ACCESS), "access_log_class": logs.AccessLog}

    def _limits(self) -> ConnectionLimits:
        hs = self.settings.hub
        return ConnectionLimits(header_timeout_s=hs.header_timeout_s,
                                max_pending_connections=hs.max_pending_connections,
                                max_pending_per_client=hs.max_pending_per_client,
                                max_connections_per_client=hs.max_connections_per_client)

    async def _metrics_listen_ctx(self, _app: web.Application) -> AsyncIterator[None]:
        """Serve `/metrics` alone on `hub.metrics_listen` while the hub runs (open there unless a token is set)."""
        hs = self.settings.hub
        host, port = listen_address(hs.metrics_listen or "")
        app = web.Application(middlewares=[edge.edge_middleware(hs.body_timeout_s)])
        door = health.MetricsDoor(self.auth, hs.metrics_token, open_without_token=True)
        app.router.add_get("/metrics", health.metrics_handler(HealthService(self.db), self.metrics, door))
        runner = GuardedAppRunner(app, self._limits(), self.clock, **self._access_log())
        await runner.setup()
        try:
            await web.TCPSite(runner, host, port).start()
        except OSError as e:
            await runner.cleanup()
            raise AmuxError(f"cannot listen on {host}:{port} for /metrics ({e.strerror}); set hub.metrics_listen "
                            "to a free HOST:PORT") from e
        self.metrics_url = url_of(host, runner.addresses[0][1]) + "/metrics"
        try:
            yield
        finally:
            await runner.cleanup()

    async def _resources_ctx(self, _app: web.Application) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await self.tasks.aclose()  # a submission still waiting for its commit
            await self.loops.stop()  # what is left: the runner pump (started by the first runner connection)
            await self.alerts.aclose()  # the alert channel's HTTP clients; nothing sends through it any more
            if self.bot_services.directory is not None:
                await self.bot_services.directory.aclose()

    async def _mcp_ctx(self, _app: web.Application) -> AsyncIterator[None]:
        async with self.mcp.lifespan(await shared_key(self.db, "mcp-session", self.clock.now())):
            yield

    async def _chat_step(self) -> float:
        """Drive the chat Turns' cards (one pass of the chat loop); what it queued wakes the chat outbox's loop."""
        return await self.chats.step()

    async def _chat_outputs_step(self) -> float:
        """Deliver the chat outputs that are due (one pass of the chat outbox's loop, apart from the driver's, so
        a progress card never waits behind a pass that drives other Turns)."""
        return 0.0 if await self.chat_outbox.deliver_once() else self.settings.hub.poll_s

    async def _loops_ctx(self, _app: web.Application) -> AsyncIterator[None]:
        loops, hs = self.loops, self.settings.hub
        loops.start("placement", self.dispatcher.placement_step, interval_s=hs.poll_s * 2, wake=self.dispatcher.kicked)
        loops.start("reaper", self.dispatcher.reaper_step, interval_s=1.0)
        if self.db.is_sqlite:
            loops.start("sqlite-checkpoint", self.db.checkpoint, interval_s=1.0)
        loops.start("lease-reaper", self.leases.reaper_step, interval_s=30.0)
        loops.start("runtime-reaper", self.registry.reap_step, interval_s=60.0)
        loops.start("timeline-sweeper", self.timeline.sweep_step, interval_s=self.settings.timeline.sweep_s)
        loops.start("alerts", self.alerts.step, interval_s=self.settings.alerts.poll_s, wake=self.alerts.kicked)
        loops.start("chat", self._chat_step, interval_s=hs.poll_s, wake=self.chats.kicked)
        loops.start("chat-outbox", self._chat_outputs_step, interval_s=hs.poll_s, wake=self.chats.outputs_due)
        self.schedule_firing.start_loops(loops)
        loops.start("schedule-reconciler", self.schedule_firing.reconciler_step,
                    interval_s=self.settings.schedules.reconcile_s)
        try:
            yield
        finally:
            await loops.stop()
