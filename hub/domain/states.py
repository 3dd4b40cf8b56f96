"""The closed sets of state names the hub stores; each member equals the string in its column.

`StrEnum` members compare equal to their strings, so stored values and JSON views do not change.
The task-run `Status` lives with its rules in `hub.domain.tasks`.
"""
from __future__ import annotations

from enum import StrEnum


class IncidentState(StrEnum):
    """Where an incident is (`incidents.state`); see `hub.domain.alerts` for the transitions."""

    PENDING = "pending"        # opened, its first card waits for the aggregation period
    OPEN = "open"              # its card is out
    RECOVERING = "recovering"  # a success after trouble; closes after the stable period
    CLOSED = "closed"
    WITHDRAWN = "withdrawn"    # unknown-only, followed by a definite outcome before its wait ended: no notice


class NoticeState(StrEnum):
    """Where an outbox notice is (`outbox.state`); only PENDING is claimed, the rest are terminal."""

    PENDING = "pending"
    SENT = "sent"
    DEAD = "dead"                # permanent delivery error
    UNCONFIRMED = "unconfirmed"  # retries ran past Feishu's dedup window
    RETIRED = "retired"          # the administrator changed
    FOLDED = "folded"            # rate limited: folded into a digest
    SUPERSEDED = "superseded"    # a newer update of the same card replaces it


class DeliveryState(StrEnum):
    """Whether the hub may deliver to a Feishu application (`feishu_apps.delivery_state`)."""

    OK = "ok"
    SUSPENDED = "suspended"        # until `amux feishu recheck`
    UNCONFIGURED = "unconfigured"  # no administrator


class MailState(StrEnum):
    """Where an instance mailbox message is (`mailbox.state`)."""

    QUEUED = "queued"        # waits for the instance's next run
    PENDING = "pending"      # offered to the running task
    DELIVERED = "delivered"
    UNKNOWN = "unknown"      # the running task ended without confirming it


class InstanceStatus(StrEnum):
    """What an instance is doing, as its view reports it (derived, not stored)."""

    ACTIVE = "active"
    IDLE = "idle"
    ARCHIVED = "archived"


class BindingStatus(StrEnum):
    """Whether a Feishu identity binding counts (`identity_bindings.status`)."""

    ACTIVE = "active"
    REVOKED = "revoked"


class RuntimeStatus(StrEnum):
    """Whether a runtime's runner is connected (`runtimes.status`)."""

    ONLINE = "online"
    OFFLINE = "offline"
    LOST = "lost"
