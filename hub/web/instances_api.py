"""`/api/v1/instances…`: REST over the InstanceService (the CLI uses it); inputs typed in api_models.py, answers are
the service's views (hub/services/views.py), sent as their `wire()` form."""
from __future__ import annotations

from aiohttp import web

from ..services.sessions.instances import InstanceService
from ..services.views import (FollowupView, InstanceCreatedView, InstanceListView, InstanceView, InstanceWaitView,
                              InterruptView, MailView, SteerView)
from . import api_models as m
from .api_models import Call, register


def add_routes(app: web.Application, instances: InstanceService) -> None:
    """Register the Agent Instance endpoints (the same service and rules as the instance_* MCP tools)."""
    service = instances

    async def create(c: Call) -> InstanceCreatedView:
        return await service.create(c.caller, **c.body.model_dump(exclude_unset=True))

    async def get(c: Call) -> InstanceView:
        return await service.get(c.caller, c.path.id)

    async def list_(c: Call) -> InstanceListView:
        return await service.list(c.caller, archived=m.flag(c.query.archived), limit=c.query.limit)

    async def followup(c: Call) -> FollowupView:
        fields = c.body.model_dump(exclude_unset=True)
        prompt, timeout_s = fields.pop("prompt"), fields.pop("timeout_s", None)
        return await service.followup(c.caller, c.path.id, prompt, timeout_s=timeout_s, **fields)

    async def send(c: Call) -> MailView:
        return await service.send(c.caller, c.path.id, c.body.text)

    async def steer(c: Call) -> SteerView:
        return await service.steer(c.caller, c.path.id, c.body.text)

    async def interrupt(c: Call) -> InterruptView:
        return await service.interrupt(c.caller, c.path.id)

    async def wait(c: Call) -> InstanceWaitView:
        return await service.wait(c.caller, c.path.id, c.query.timeout_s)

    async def archive(c: Call) -> InstanceView:
        return await service.archive(c.caller, c.path.id)

    for o, fn in ((m.INSTANCE_CREATE, create), (m.INSTANCE_LIST, list_),
                  (m.INSTANCE_GET, get), (m.INSTANCE_FOLLOWUP, followup),
                  (m.INSTANCE_SEND, send), (m.INSTANCE_STEER, steer), (m.INSTANCE_INTERRUPT, interrupt),
                  (m.INSTANCE_WAIT, wait), (m.INSTANCE_ARCHIVE, archive)):
        register(app, o, fn)
