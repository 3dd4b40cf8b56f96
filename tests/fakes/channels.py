"""Delivery channels the composition root can load by name (`feishu.channel = "tests.fakes.channels:…"`)."""
from __future__ import annotations

from typing import Any

from hub.services.alerts.channel import RETRY, Delivery

BUILT: list["RecordingChannel"] = []  # every channel `build` made in this process, for the test to look at


class RecordingChannel:
    """Deliver nothing (every call is a retry); record whether the hub closed it."""

    def __init__(self) -> None:
        self.closed = 0

    async def send(self, app_id: str, recipient: str, view: dict[str, Any], request_uuid: str) -> Delivery:
        """Refuse (retry later)."""
        return Delivery(RETRY, error="recording channel")

    async def reply(self, app_id: str, message_id: str, view: dict[str, Any], request_uuid: str) -> Delivery:
        """Refuse (retry later)."""
        return Delivery(RETRY, error="recording channel")

    async def update(self, app_id: str, message_id: str, view: dict[str, Any]) -> Delivery:
        """Refuse (retry later)."""
        return Delivery(RETRY, error="recording channel")

    async def aclose(self) -> None:
        """Count the close."""
        self.closed += 1


def build(settings: Any) -> RecordingChannel:
    """Make a channel and remember it."""
    channel = RecordingChannel()
    BUILT.append(channel)
    return channel
