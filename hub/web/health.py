"""`/healthz`, `/readyz` and `/metrics` (Prometheus text format)."""
from __future__ import annotations

from typing import Iterator

from aiohttp import web
from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily

from ..domain.tasks import Status
from ..domain.states import RuntimeStatus
from ..loops import Loops
from ..services.health import HealthService


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


def add_routes(app: web.Application, health: HealthService, metrics: Metrics, loops: Loops) -> None:
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

    async def metrics_view(_: web.Request) -> web.Response:
        await metrics.refresh(health)
        return web.Response(body=generate_latest(metrics.registry), content_type="text/plain", charset="utf-8")

    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    app.router.add_get("/metrics", metrics_view)
