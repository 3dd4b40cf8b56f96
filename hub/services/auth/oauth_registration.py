"""Dynamic client registration (RFC 7591) under limits: it is unauthenticated, so it is rate-limited per client
address and the clients it made that never completed an authorization are pruned.

Rules: an address may register `oauth.register_per_minute` clients a minute on each replica (the count is
kept in memory: with N replicas behind a balancer an address gets at most N times that); past it the answer
is 429 with `Retry-After`. A client registered more than `oauth.unused_client_ttl_s` ago that holds no grant
is deleted; registrations prune (at most once a minute per replica, by the injected clock), so the table
grows only with clients people authorized, whatever a flood registers.
"""
from __future__ import annotations

import logging
from datetime import datetime, timedelta
from typing import Any

from ...clock import Clock
from ...config import OAuthSettings
from ...domain.durations import duration_text
from ...domain.rate import WindowLimit
from .oauth import OAuthError, OAuthService

log = logging.getLogger("amux.oauth")

PRUNE_EVERY_S = 60.0
PRUNE_BATCH = 1000


class RegistrationLimited(OAuthError):
    """A registration refused because its address registered too many clients this minute."""

    def __init__(self, description: str, retry_after_s: float) -> None:
        super().__init__("temporarily_unavailable", description, 429)
        self.retry_after_s = retry_after_s


class ClientRegistration:
    """Register OAuth clients through `OAuthService.register`, rate-limited per address, pruning unused clients."""

    def __init__(self, oauth: OAuthService, clock: Clock, settings: OAuthSettings) -> None:
        self.oauth, self.clock, self.settings = oauth, clock, settings
        self.limit = WindowLimit(settings.register_per_minute, 60.0)
        self.ttl = timedelta(seconds=settings.unused_client_ttl_s)
        self._pruned_at: datetime | None = None

    async def register(self, body: bytes, address: str | None) -> dict[str, Any]:
        """Register a client for `address` (the caller's IP); RegistrationLimited past the per-minute limit."""
        now = self.clock.now()
        if self.settings.register_per_minute:
            wait = self.limit.hit(address or "-", now)
            if wait is not None:
                raise RegistrationLimited(
                    f"{address or 'this address'} registered {self.settings.register_per_minute} clients in the "
                    f"last minute (oauth.register_per_minute); retry in {duration_text(max(1, round(wait)))}, or "
                    "reuse a client you registered", wait)
        await self.prune_if_due(now)
        return await self.oauth.register(body)

    async def prune_if_due(self, now: datetime) -> int:
        """Prune unused clients if this replica has not in the last minute; never fail the caller for it."""
        if self._pruned_at is not None and (now - self._pruned_at).total_seconds() < PRUNE_EVERY_S:
            return 0
        self._pruned_at = now
        try:
            return await self.prune(now)
        except Exception as e:  # noqa: BLE001 - a registration must not fail because pruning did; the next one retries
            log.warning("pruning unused OAuth clients failed (%s); the next registration tries again",
                        type(e).__name__)
            return 0

    async def prune(self, now: datetime) -> int:
        """Delete clients older than `unused_client_ttl_s` that never completed an authorization; return how many."""
        async with self.oauth.db.write() as conn:
            gone = await self.oauth.store.prune_unused_clients(conn, created_before=now - self.ttl, limit=PRUNE_BATCH)
        if gone:
            log.info("pruned %d OAuth clients that never completed an authorization", gone)
        return gone
