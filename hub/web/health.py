"""`/healthz`, `/readyz` and `/metrics` (Prometheus text format).

`/metrics` says how busy the hub is and who runs on it, so it is not public: it answers the bearer token
`hub.metrics_token` when one is set, else an admin token. `hub.metrics_listen` serves `/metrics` alone on an
address of its own (for a scraper inside the network); there it is open unless `hub.metrics_token` is set.
"""
from __future__ import annotations

import hmac
from typing import Awaitable, Callable, Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from ..domain.tasks import Status
from ..domain.states import RuntimeStatus
from ..errors import AmuxError
from ..loops import Loops
from ..services.auth.service import AuthService
from ..services.tasks.health import HealthService
from ..logs import REQUEST_ID
from .edge import refusal


class Metrics:
    """This replica's registry: task counts read from the store at scrape, latencies observed here."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.dispatch_latency = Histogram(
            "amux_dispatch_latency_seconds", "Time from task admission to the runner starting it",
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10), registry=self.registry)
        self.counts: dict[str, dict[str, int]] = {"tasks": {}, "runtimes": {}}
        self.registry.register(self)

    def collect(self) -> Iterator[GaugeMetricFamily]:
        """Yield gauges from the last refresh."""
        g = GaugeMetricFamily("amux_tasks", "Tasks by status", labels=["status"])
        for status in Status:
            g.add_metric([status.value], self.counts["tasks"].get(status.value, 0))
        yield g
        r = GaugeMetricFamily("amux_runtimes", "Runtimes by status", labels=["status"])
        for state in RuntimeStatus:
            r.add_metric([state.value], self.counts["runtimes"].get(state.value, 0))
        yield r

    async def refresh(self, health: HealthService) -> None:
        """Read current counts from the store."""
        self.counts = await health.counts()


class MetricsDoor:
    """Decide who may scrape `/metrics`: the metrics token when set, else an admin token (or anyone, if `open`)."""

    def __init__(self, auth: AuthService, token: str | None, *, open_without_token: bool = False) -> None:
        self.auth, self.token, self.open = auth, token or None, open_without_token and not token

    async def refusal(self, request: web.Request) -> web.Response | None:
        """Return the 401/403 a request without the right credentials gets, or None when it may scrape."""
        if self.open:
            return None
        header = request.headers.get("Authorization", "")
        given = header[7:].strip() if header[:7].lower() == "bearer " else ""
        rid = request.get(REQUEST_ID, "-")
        if self.token is not None:
            if given and hmac.compare_digest(given.encode(), self.token.encode()):
                return None
            return _challenge(refusal(401, "unauthorized", "send the metrics token: `Authorization: Bearer "
                                      "<hub.metrics_token>` (Prometheus: `authorization: {credentials_file: …}`)",
                                      rid))
        try:
            caller = await self.auth.authenticate(header or None)
        except AmuxError:
            caller = None
        if caller is None:
            return _challenge(refusal(401, "unauthorized", "send an admin token (`Authorization: Bearer …`, made with "
                                      "`amux token create --admin`), or set hub.metrics_token for Prometheus, or "
                                      "hub.metrics_listen to serve /metrics on an address of its own", rid))
        if not caller.admin:
            return refusal(403, "forbidden", "/metrics needs an admin token (`amux token create --admin`) or "
                                             "hub.metrics_token", rid)
        return None


def _challenge(response: web.Response) -> web.Response:
    response.headers["WWW-Authenticate"] = 'Bearer realm="amux metrics"'
    return response


def metrics_handler(health: HealthService, metrics: Metrics,
                    door: MetricsDoor) -> Callable[[web.Request], Awaitable[web.Response]]:
    """Return the `/metrics` handler: the door first, then a fresh read of the store."""

    async def metrics_view(request: web.Request) -> web.Response:
        refused = await door.refusal(request)
        if refused is not None:
            return refused
        await metrics.refresh(health)
        return web.Response(body=generate_latest(metrics.registry), content_type="text/plain", charset="utf-8")

    return metrics_view


def add_routes(app: web.Application, health: HealthService, metrics: Metrics, loops: Loops,
               door: MetricsDoor) -> None:
    """Register the health and metrics endpoints."""

    async def healthz(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    async def readyz(_: web.Request) -> web.Response:
        try:
            await health.ping()
        except Exception as e:  # noqa: BLE001 — any failure makes the replica unready: the point is to report it
            return web.json_response({"ok": False, "database": str(e)[:200], "loops": loops.views()}, status=503)
        problems = loops.problems()
        if problems:
            return web.json_response({"ok": False, "problems": problems, "loops": loops.views()}, status=503)
        return web.json_response({"ok": True, "loops": loops.views()})

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_handler(health, metrics, door))
