"""One authorization policy for schedules: who may read and control which schedule.

Used by every reader: REST and MCP (`ScheduleService`), the Feishu bot's personal views and card actions,
and upgrade recovery's personal view — none of them keeps visibility rules of its own.

- The frozen creator: only schedules whose `creator_id` is the caller's principal (an admin token sees
  everyone's over REST/MCP/CLI, as before; a Feishu operator never acts as admin).
- A Feishu operator (a Caller made from an identity binding, `Viewer.caller()`) additionally needs:
  its own binding still active (current access), the application scope (a schedule frozen to another
  application is not shown; one frozen to no application is visible only through the creator principal's own
  linked identities), and the schedule's creator binding, if it has one, still active.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa

from ..store.tables import identity_bindings, schedules

FEISHU = "feishu:"


@dataclass(frozen=True)
class FeishuScope:
    """The Feishu identity a Caller acts through: application and identity binding."""

    app_id: str
    binding_id: str


def feishu_scope(caller: Any) -> FeishuScope | None:
    """Return the identity a bot-made Caller acts through (label `feishu:<app>`, token `feishu:<binding>`), else None."""
    label, token = getattr(caller, "label", None) or "", getattr(caller, "token_id", None) or ""
    if label.startswith(FEISHU) and token.startswith(FEISHU):
        return FeishuScope(label[len(FEISHU):], token[len(FEISHU):])
    return None


def visible(caller: Any, *, include_deleted: bool = False, everyone: bool = False) -> Any:
    """Return the WHERE clause of the schedules `caller` may read and control (the one decision).

    `everyone` widens an admin token's view to every principal's schedules; it never widens a Feishu operator's.
    """
    scope = feishu_scope(caller)
    if scope is None:
        clause = sa.true() if everyone and caller.admin else schedules.c.creator_id == caller.principal_id
    else:
        clause = for_identity(caller.principal_id, scope)
    return clause if include_deleted else sa.and_(clause, schedules.c.deleted_at.is_(None))


def for_identity(principal_id: str, scope: FeishuScope) -> Any:
    """Return the clause for a Feishu identity of `principal_id` in `scope.app_id` (see the module rules)."""
    active = sa.select(identity_bindings.c.id).where(identity_bindings.c.status == "active",
                                                     identity_bindings.c.principal_id == principal_id)
    own_binding_active = sa.exists().where(identity_bindings.c.id == scope.binding_id,
                                           identity_bindings.c.principal_id == principal_id,
                                           identity_bindings.c.app_id == scope.app_id,
                                           identity_bindings.c.status == "active")
    return sa.and_(schedules.c.creator_id == principal_id, own_binding_active,
                   sa.or_(schedules.c.app_id == scope.app_id,
                          sa.and_(schedules.c.app_id.is_(None), schedules.c.creator_binding_id.is_(None))),
                   sa.or_(schedules.c.creator_binding_id.is_(None), schedules.c.creator_binding_id.in_(active)))
