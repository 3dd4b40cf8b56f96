"""`GET /api/v1/sessions`: the caller's sessions over the SessionService (create, show and send live in rest.py)."""
from __future__ import annotations

from aiohttp import web

from ..services.sessions.service import SessionService
from . import api_models as m
from .api_models import Call, register


def add_routes(app: web.Application, sessions: SessionService) -> None:
    """Register the session listing endpoint."""
    service = sessions

    async def listing(c: Call) -> dict:
        return {"sessions": await service.list(c.caller, c.query.limit)}

    register(app, m.SESSION_LIST, listing)
