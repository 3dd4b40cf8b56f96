"""The delivery-channel seam of the outbox: a channel sends, the pipeline decides about retries.

Channel packages (e.g. `bot.feishu.channel`) import this module, never the reverse; the composition
root loads the configured channel by name (`feishu.channel`), so `hub` never imports `bot`.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Protocol

OK, RETRY, PERMANENT, SUSPEND = "ok", "retry", "permanent", "suspend"


@dataclass(frozen=True)
class Delivery:
    """A channel's classified result of one call.

    `result`: ok (delivered; `message_id` set for send/reply) | retry (transient: worth retrying with the
    same request uuid; `retry_after_s` when the platform said how long to wait) | permanent (never
    retry; `card_gone` when the update target is too old, recalled or deleted — send a fresh card) |
    suspend (the recipient cannot be reached until an explicit recheck).
    """

    result: str
    message_id: str | None = None
    error: str | None = None
    code: int | None = None
    retry_after_s: float | None = None
    card_gone: bool = False


class Channel(Protocol):
    """Where the outbox delivers notices; `view` is the notice's view model (the channel renders it)."""

    async def send(self, app_id: str, recipient: str, view: dict[str, Any], request_uuid: str) -> Delivery:
        """Send a new message; the same `request_uuid` must never produce a second message (platform dedup)."""

    async def reply(self, app_id: str, message_id: str, view: dict[str, Any], request_uuid: str) -> Delivery:
        """Reply to `message_id` (a reminder under its card); same uuid rule as `send`."""

    async def update(self, app_id: str, message_id: str, view: dict[str, Any]) -> Delivery:
        """Replace the card `message_id` in place (idempotent: the last update wins)."""

    async def aclose(self) -> None:
        """Release connections."""


class NullChannel:
    """Deliver nowhere: every call is a retry (used when no channel could be loaded)."""

    def __init__(self, reason: str = "no delivery channel is configured") -> None:
        self.reason = reason

    async def send(self, app_id: str, recipient: str, view: dict[str, Any], request_uuid: str) -> Delivery:
        """Refuse (retry later)."""
        return Delivery(RETRY, error=self.reason)

    async def reply(self, app_id: str, message_id: str, view: dict[str, Any], request_uuid: str) -> Delivery:
        """Refuse (retry later)."""
        return Delivery(RETRY, error=self.reason)

    async def update(self, app_id: str, message_id: str, view: dict[str, Any]) -> Delivery:
        """Refuse (retry later)."""
        return Delivery(RETRY, error=self.reason)

    async def aclose(self) -> None:
        """Nothing to release."""


def load_channel(spec: str, settings: Any) -> Channel:
    """Build the channel `module:factory` names, calling `factory(settings)`; NullChannel when it cannot load."""
    module, _, name = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        return NullChannel(f"channel {spec!r} could not be loaded ({e}); install it or set feishu.channel")
    return factory(settings)
