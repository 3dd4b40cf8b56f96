"""The delivery-channel seam of the outbox: a channel sends, the pipeline decides about retries.

Channel packages (e.g. `bot.feishu.channel`) import this module, never the reverse; the composition
root loads the configured channel by name (`feishu.channel`) when Feishu applications are configured, and a
channel that cannot be loaded stops the hub at start with the fix (no silent fallback). `ConsoleChannel` is the
explicit choice when no application is configured (it confirms the console's own application's notices and
refuses any other, as `NullChannel` does): then lark-oapi is never imported.
"""
from __future__ import annotations

import importlib
from dataclasses import KW_ONLY, dataclass
from typing import Any, Protocol

from ...errors import Invalid

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
    _: KW_ONLY  # the result reads best positionally (`Delivery(OK, message_id=...)`); the rest by name
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
    """Deliver nowhere: every call is a retry (the channel of a hub with no Feishu application configured)."""

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


CONSOLE_APP = "cli_console"  # the bot console's own application (bot/console.py), known when none is configured


class ConsoleChannel(NullChannel):
    """The channel of a hub with no Feishu application: the console's own application (`cli_console`) is
    delivered where the console reads it — the outbox itself (`/console/api/chat`) — so each of its notices is
    confirmed at once, under a message id its request uuid names; any other application is refused as by
    `NullChannel`."""

    async def send(self, app_id: str, recipient: str, view: dict[str, Any], request_uuid: str) -> Delivery:
        """Confirm a console notice; refuse any other (retry later)."""
        return await self._console(app_id, request_uuid) or await super().send(app_id, recipient, view, request_uuid)

    async def reply(self, app_id: str, message_id: str, view: dict[str, Any], request_uuid: str) -> Delivery:
        """Confirm a console reply; refuse any other (retry later)."""
        return await self._console(app_id, request_uuid) or await super().reply(app_id, message_id, view,
                                                                                 request_uuid)

    async def update(self, app_id: str, message_id: str, view: dict[str, Any]) -> Delivery:
        """Confirm a console card's update (the console shows the newest); refuse any other (retry later)."""
        return await self._console(app_id, None) or await super().update(app_id, message_id, view)

    @staticmethod
    async def _console(app_id: str, request_uuid: str | None) -> Delivery | None:
        if app_id != CONSOLE_APP:
            return None
        return Delivery(OK, message_id=f"om_console_{request_uuid}" if request_uuid else None)


def load_channel(spec: str, settings: Any) -> Channel:
    """Build the channel `module:factory` names, calling `factory(settings)`; refuse, naming the fix, when the
    module or a package it needs cannot be imported or has no such factory."""
    module, _, name = spec.partition(":")
    try:
        factory = getattr(importlib.import_module(module), name)
    except ImportError as e:
        missing = (e.name or module).split(".")[0]
        fix = ("install it with `pip install 'lark-oapi>=1.4'` (a dependency of amux-hub)" if missing == "lark_oapi"
               else f"install the package that provides {missing!r}")
        raise Invalid(f"the delivery channel {spec!r} (feishu.channel) cannot be loaded: {e}; {fix}, or set "
                      "feishu.channel to an importable module:factory") from e
    except AttributeError as e:
        raise Invalid(f"the delivery channel {spec!r} (feishu.channel) names no factory {name!r} in {module}; "
                      "set feishu.channel to module:factory") from e
    return factory(settings)
