"""`GET /api/v1/tasks/{id}/timeline` and `GET /api/v1/turns/{id}/timeline`: the Agent Timeline over REST."""
from __future__ import annotations

from aiohttp import web

from ..services.tasks.timeline import TimelineService
from . import api_models as m
from .api_models import Call, register


def add_routes(app: web.Application, timeline: TimelineService) -> None:
    """Register the timeline endpoints."""

    async def task_timeline(c: Call) -> dict:
        return await timeline.read(c.caller, "task", c.path.id, c.query.cursor, c.query.limit)

    async def turn_timeline(c: Call) -> dict:
        return await timeline.read(c.caller, "turn", c.path.id, c.query.cursor, c.query.limit)

    register(app, m.TASK_TIMELINE, task_timeline)
    register(app, m.TURN_TIMELINE, turn_timeline)
