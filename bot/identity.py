"""Feishu identities → principals: the first contact creates (or finds) a principal and an active binding."""
from __future__ import annotations

from dataclasses import dataclass

from hub.services.auth.service import Caller
from hub.services.auth.identity import Contact, IdentityService


@dataclass(frozen=True, kw_only=True)
class Viewer:
    """An authenticated Feishu operator: application, open_id, principal and active binding."""

    app_id: str
    open_id: str
    principal_id: str
    name: str
    binding_id: str
    is_admin: bool

    def caller(self) -> Caller:
        """Return the hub Caller this operator acts as (never an admin token: creator-scoped everywhere)."""
        return Caller(self.principal_id, self.name, f"feishu:{self.binding_id}", f"feishu:{self.app_id}", False)


class IdentityBindings:
    """Turn Feishu identities into Viewers through the identity service (bindings shared with the alert pipeline)."""

    def __init__(self, identity: IdentityService) -> None:
        self.identity = identity

    async def bind(self, app_id: str, open_id: str, admin_open_id: str | None, union_id: str | None = None,
                   user_id: str | None = None) -> Viewer | None:
        """Return the operator's Viewer, creating principal and binding on first contact; None when revoked."""
        return _viewer(await self.identity.contact(app_id, open_id, union_id, user_id), app_id, open_id, admin_open_id)

    async def find(self, app_id: str, open_id: str, admin_open_id: str | None) -> Viewer | None:
        """Return the Viewer of an active binding, or None."""
        return _viewer(await self.identity.find_contact(app_id, open_id), app_id, open_id, admin_open_id)


def _viewer(contact: Contact | None, app_id: str, open_id: str, admin_open_id: str | None) -> Viewer | None:
    if contact is None:
        return None
    return Viewer(app_id=app_id, open_id=open_id, principal_id=contact.principal_id, name=contact.name,
                  binding_id=contact.binding_id, is_admin=bool(admin_open_id) and open_id == admin_open_id)
