"""Schedule history with legacy submissions: pre-ledger records shown as `unconfirmed`, once per Task.

A legacy submission record says a Task was submitted; nothing reconciled its outcome, so it is shown
with outcome `unconfirmed` and `legacy: true`. When a ledger firing correlates the same Task, only the
firing is shown (the ledger is the truth). Older uncorrelated history is never used for alerts.
"""
from __future__ import annotations

import sqlalchemy as sa

from ..store.tables import firings, legacy_submissions

UNCONFIRMED = "unconfirmed"


def _typed(value, type_):  # noqa: ANN001, ANN202
    # UNION branches need explicit types on PostgreSQL (asyncpg cannot infer a bare parameter's type).
    return sa.cast(sa.literal(value) if value is not None else sa.null(), type_)


def entries(schedule_id: str) -> sa.Select:
    """Return a select of the schedule's ledger firings and uncorrelated legacy submissions, newest first.

    Rows carry the `firings` columns, so `firing_view` renders both kinds.
    """
    ledger = sa.select(firings.c.id, firings.c.nominal_time, firings.c.fired_at, firings.c.admission,
                       firings.c.task_id, firings.c.turn_id, firings.c.outcome, firings.c.missed_count,
                       firings.c.reconciled_at, firings.c.legacy).where(firings.c.schedule_id == schedule_id)
    correlated = sa.exists().where(firings.c.task_id == legacy_submissions.c.task_id)
    legacy = (sa.select(
        legacy_submissions.c.id, legacy_submissions.c.submitted_at.label("nominal_time"),
        legacy_submissions.c.submitted_at.label("fired_at"),
        sa.case((legacy_submissions.c.task_id.is_not(None), _typed("ok", sa.String(500))),
                else_=_typed(None, sa.String(500))).label("admission"),
        legacy_submissions.c.task_id, _typed(None, sa.String(40)).label("turn_id"),
        _typed(UNCONFIRMED, sa.String(16)).label("outcome"), _typed(0, sa.Integer).label("missed_count"),
        _typed(None, firings.c.reconciled_at.type).label("reconciled_at"),
        _typed(True, sa.Boolean).label("legacy"))
        .where(legacy_submissions.c.schedule_id == schedule_id,
               sa.or_(legacy_submissions.c.task_id.is_(None), ~correlated)))
    both = sa.union_all(ledger, legacy).subquery("history")
    return sa.select(both).order_by(both.c.nominal_time.desc(), both.c.id.desc())
