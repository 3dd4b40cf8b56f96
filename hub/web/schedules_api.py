"""`/api/v1/schedules…`: REST over the ScheduleService (the CLI uses it); inputs typed in api_models.py."""
from __future__ import annotations

from aiohttp import web

from ..services.schedules.service import ScheduleService, ScheduleSpec
from ..services.views import ScheduleView
from . import api_models as m
from .api_models import Call, flag, register


def add_routes(app: web.Application, schedules: ScheduleService) -> None:
    """Register the schedule endpoints."""
    service = schedules

    async def create(c: Call) -> ScheduleView:
        data = c.body.model_dump(exclude_unset=True)
        source = data.pop("source", "rest")
        return await service.create(c.caller, ScheduleSpec.from_dict(data), source=source)

    async def listing(c: Call) -> dict:
        return {"schedules": await service.list(c.caller, c.query.limit, flag(c.query.all))}

    async def get(c: Call) -> ScheduleView:
        return await service.get(c.caller, c.path.id)

    async def update(c: Call) -> ScheduleView:
        return await service.update(c.caller, c.path.id, ScheduleSpec.from_dict(c.body.model_dump(exclude_unset=True)))

    async def pause(c: Call) -> ScheduleView:
        return await service.pause(c.caller, c.path.id)

    async def resume(c: Call) -> ScheduleView:
        return await service.resume(c.caller, c.path.id)

    async def run_now(c: Call) -> dict:
        return await service.run_now(c.caller, c.path.id)

    async def delete(c: Call) -> dict:
        return await service.delete(c.caller, c.path.id)

    async def history(c: Call) -> dict:
        return await service.history(c.caller, c.path.id, c.query.cursor, c.query.limit)

    for o, fn in ((m.SCHEDULE_CREATE, create), (m.SCHEDULE_LIST, listing), (m.SCHEDULE_GET, get),
                  (m.SCHEDULE_UPDATE, update), (m.SCHEDULE_PAUSE, pause), (m.SCHEDULE_RESUME, resume),
                  (m.SCHEDULE_DELETE, delete),
                  (m.SCHEDULE_RUN_NOW, run_now), (m.SCHEDULE_HISTORY, history)):
        register(app, o, fn)
