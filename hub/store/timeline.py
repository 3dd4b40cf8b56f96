"""The Agent Timeline's rows (`timeline_events`): raw agent events of each run, kept apart from task events."""
from __future__ import annotations

from datetime import datetime
from typing import Any

import sqlalchemy as sa

from ..domain.states import BindingStatus
from .db import Connection, Row, execute_many
from .tables import feishu_apps, firings, identity_bindings, incidents, timeline_events

_INSERT = timeline_events.insert()


def timeline_rows(run_id: str, events: list[tuple[int, str, Any]], now: datetime) -> list[dict[str, Any]]:
    """The rows of `events` (runner sequence, type, raw payload) of one run."""
    return [{"run_id": run_id, "rseq": rseq, "type": type_, "payload": payload, "created_at": now}
            for rseq, type_, payload in events]


class SqlTimelineStore:
    """Raw agent events by run; written with the batch that carries them, read by owner-checked services."""

    @staticmethod
    async def insert(conn: Connection, rows: list[dict[str, Any]]) -> None:
        """Insert timeline rows (`timeline_rows`) of any runs in the caller's transaction. A runner's resend never
        reaches here: the hub skips events at or below the run's last applied runner sequence."""
        await execute_many(conn, _INSERT, rows)

    @staticmethod
    async def after(conn: Connection, run_id: str, cursor: int, limit: int) -> list[Row]:
        """Return up to `limit` of the run's events after runner sequence `cursor`, oldest first."""
        return list((await conn.execute(
            sa.select(timeline_events.c.rseq, timeline_events.c.type, timeline_events.c.payload,
                      timeline_events.c.created_at)
            .where(timeline_events.c.run_id == run_id, timeline_events.c.rseq > cursor)
            .order_by(timeline_events.c.rseq).limit(limit))).all())

    @staticmethod
    async def shown_to_app_admin(conn: Connection, run_id: str, principal_id: str) -> bool:
        """Say whether `principal_id` administers a Feishu application whose alert center shows the run: a Task or
        Turn of a firing of a schedule with an incident in that application, the principal bound (actively, in
        that application) to the application's administrator identity."""
        found = (await conn.execute(
            sa.select(sa.literal(1)).select_from(firings)
            .join(incidents, incidents.c.schedule_id == firings.c.schedule_id)
            .join(feishu_apps, feishu_apps.c.app_id == incidents.c.app_id)
            .join(identity_bindings, sa.and_(identity_bindings.c.app_id == feishu_apps.c.app_id,
                                             identity_bindings.c.open_id == feishu_apps.c.admin_open_id))
            .where(sa.or_(firings.c.task_id == run_id, firings.c.turn_id == run_id),
                   identity_bindings.c.principal_id == principal_id,
                   identity_bindings.c.status == BindingStatus.ACTIVE).limit(1))).first()
        return found is not None

    @staticmethod
    async def sweep(conn: Connection, before: datetime, limit: int) -> int:
        """Delete up to `limit` events recorded before `before` (oldest first); return how many went."""
        oldest = (sa.select(timeline_events.c.id).where(timeline_events.c.created_at < before)
                  .order_by(timeline_events.c.created_at).limit(limit))
        ids = [r.id for r in (await conn.execute(oldest)).all()]
        if not ids:
            return 0
        await conn.execute(timeline_events.delete().where(timeline_events.c.id.in_(ids)))
        return len(ids)
