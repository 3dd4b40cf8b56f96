"""`/api/v1/alerts…` and `/api/v1/feishu/apps/{app}/recheck`: REST over the AlertService (the CLI uses it).

Administrators only (the alert center is the operator's view): the route table refuses anyone else with 403
before any input is read.
"""
from __future__ import annotations

from aiohttp import web

from ..errors import Invalid
from ..services.alerts.service import AlertService
from . import api_models as m
from .api_models import Call, flag, register


def add_routes(app: web.Application, alerts: AlertService) -> None:
    """Register the alert endpoints."""

    async def explain(c: Call) -> dict:
        return await alerts.explain(c.path.ref)

    async def listing(c: Call) -> dict:
        return {"incidents": await alerts.list_incidents(not flag(c.query.all)),
                "diagnostics": await alerts.diagnostics()}

    async def control(c: Call) -> dict:
        iid, action, body = c.path.id, c.path.action, c.body
        if body.comment is not None and action != "ack":
            raise Invalid(f"`comment` goes with ack only, not {action}; drop it")
        if body.for_s is not None and action != "snooze":
            raise Invalid(f"`for_s` goes with snooze only, not {action}; drop it")
        if action == "ack":
            return await alerts.acknowledge(iid, c.caller.principal, body.comment)
        if action == "snooze":
            return await alerts.snooze(iid, body.for_s)
        if action == "unsnooze":
            return await alerts.unsnooze(iid)
        return await alerts.pause(c.caller, iid)

    async def recheck(c: Call) -> dict:
        return await alerts.recheck(c.path.app)

    for o, fn in ((m.ALERT_LIST, listing), (m.ALERT_EXPLAIN, explain), (m.ALERT_CONTROL, control),
                  (m.FEISHU_RECHECK, recheck)):
        register(app, o, fn)
