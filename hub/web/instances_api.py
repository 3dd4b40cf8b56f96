"""`/api/v1/instances…`: REST over the InstanceService (the CLI uses it); inputs typed in api_models.py."""
from __future__ import annotations

from aiohttp import web

from ..services.instances import InstanceService
from . import api_models as m
from .api_models import Call, register


def add_routes(app: web.Application, instances: InstanceService) -> None:
    """Register the Agent Instance endpoints (the same service and rules as the instance_* MCP tools)."""
    service = instances

    async def create(c: Call) -> dict:
        return await service.create(c.caller, **c.body.model_dump(exclude_unset=True))

    async def get(c: Call) -> dict:
        return await service.get(c.caller, c.path.id)

    async def list_(c: Call) -> dict:
        return await service.list(c.caller, archived=m.flag(c.query.archived), limit=c.query.limit)

    async def followup(c: Call) -> dict:
        fields = c.body.model_dump(exclude_unset=True)
        prompt, timeout_s = fields.pop("prompt"), fields.pop("timeout_s", None)
        return await service.followup(c.caller, c.path.id, prompt, timeout_s=timeout_s, **fields)

    async def send(c: Call) -> dict:
        return await service.send(c.caller, c.path.id, c.body.text)

    async def steer(c: Call) -> dict:
        return await service.steer(c.caller, c.path.id, c.body.text)

    async def interrupt(c: Call) -> dict:
        return await service.interrupt(c.caller, c.path.id)

    async def wait(c: Call) -> dict:
        return await service.wait(c.caller, c.path.id, c.query.timeout_s)

    async def archive(c: Call) -> dict:
        return await service.archive(c.caller, c.path.id)

    for o, fn in ((m.INSTANCE_CREATE, create), (m.INSTANCE_LIST, list_),
                  (m.INSTANCE_GET, get), (m.INSTANCE_FOLLOWUP, followup),
                  (m.INSTANCE_SEND, send), (m.INSTANCE_STEER, steer), (m.INSTANCE_INTERRUPT, interrupt),
                  (m.INSTANCE_WAIT, wait), (m.INSTANCE_ARCHIVE, archive)):
        register(app, o, fn)
