"""Creator recovery on upgrade: bind an existing schedule to its creator's Feishu alias only when unambiguous.

Pure: `decide` is a function of (schedule row, creator principal row, the receipt's token row, the
creator's identity bindings across ALL applications, the cutoff). Rows are anything with the table's
attribute names. Every refusal leaves the schedule unbound with a reason the administrator can act on;
a wrong binding would show one person's schedules to another, so each clause fails closed.
"""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable

from .states import BindingStatus

BOUND, UNBOUND, IGNORED = "bound", "unbound", "ignored"
# Token labels an agent or child session acts under (`mcp:<client>` names an OAuth-granted MCP client,
# `amux-session:<id>` is minted for child sessions); alone they name no human origin actor.
AGENT_LABEL_PREFIXES = ("mcp:", "amux-session:", "runtime:", "agent:")
RECEIPT_FIELDS = ("source", "token_id", "principal")


@dataclass(frozen=True)
class Verdict:
    """What recovery does with one schedule: bind it (with `binding`), leave it unbound, or ignore it."""

    outcome: str
    reason: str
    binding: Any | None = None

    @property
    def binding_id(self) -> str | None:
        """Return the chosen binding's id, if any."""
        return getattr(self.binding, "id", None)

    @property
    def app_id(self) -> str | None:
        """Return the chosen binding's application, if any."""
        return getattr(self.binding, "app_id", None)


def _aware(dt: datetime | None) -> datetime | None:
    if dt is None:
        return None
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt.astimezone(timezone.utc)


def is_agent_label(label: str | None) -> bool:
    """Return whether a token label names an agent, runtime or child session rather than a person."""
    return label is not None and label.lower().startswith(AGENT_LABEL_PREFIXES)


def _unbound(reason: str) -> Verdict:
    return Verdict(UNBOUND, reason)


def in_scope(schedule: Any, cutoff: datetime) -> Verdict | None:
    """Return an `ignored` verdict for a schedule recovery must not touch, else None."""
    if schedule.type != "subtask":
        return Verdict(IGNORED, f"{schedule.type} schedules are out of scope; only subtask schedules are recovered")
    if schedule.deleted_at is not None:
        return Verdict(IGNORED, "deleted schedule: nothing to show in a personal view")
    if schedule.creator_binding_id is not None:
        return Verdict(IGNORED, "already has a creator binding")
    created, cut = _aware(schedule.created_at), _aware(cutoff)
    if created is not None and cut is not None and created > cut:
        return Verdict(IGNORED, f"created after the upgrade cutoff {cut.isoformat()}; "
                                "new schedules take their binding from the creating request")
    return None


def _receipt_refusal(schedule: Any, principal: Any, token: Any) -> str | None:
    """Check the frozen identity and its authorization receipt; return why they are unusable."""
    prov = schedule.provenance
    if schedule.creator_id is None or principal is None:
        return "no frozen creator identity: the schedule records no creator principal"
    if not isinstance(prov, dict) or not prov:
        return "no authorization receipt: the schedule's provenance is missing"
    missing = [f for f in RECEIPT_FIELDS if not prov.get(f)]
    if missing:
        return f"incomplete authorization receipt: provenance lacks {', '.join(missing)}"
    if prov["principal"] != principal.name:
        return (f"frozen identity mismatch: the receipt names principal {prov['principal']!r} "
                f"but the schedule's creator is {principal.name!r}")
    if token is None or token.id != prov["token_id"]:
        return f"authorization receipt unverifiable: token {prov['token_id']} does not exist"
    if token.principal_id != principal.id:
        return f"authorization receipt mismatch: token {token.id} belongs to another principal"
    return None


def _actor_refusal(schedule: Any, principal: Any) -> str | None:
    """Check that a person, not a service, runtime or agent alone, created the schedule."""
    prov = schedule.provenance
    if principal.kind != "user":
        return f"no human origin actor: created by {principal.kind} principal {principal.name!r}"
    label = prov.get("label")
    actor = prov.get("origin_actor")
    if is_agent_label(label) and not actor:
        return (f"no human origin actor: created under agent label {label!r} acting alone "
                "(no origin actor recorded)")
    if actor and actor != principal.name:
        return f"origin actor {actor!r} is not the creator {principal.name!r}"
    owner = prov.get("owner")
    if owner is not None and owner != principal.name:
        return f"owner mismatch: recorded owner {owner!r} is not the creator {principal.name!r}"
    return None


def _alias(principal: Any, bindings: Iterable[Any]) -> Verdict:
    """Pick exactly one active Feishu alias across all applications."""
    mine = [b for b in bindings if b.principal_id == principal.id]
    active = [b for b in mine if b.status == BindingStatus.ACTIVE]
    if len(active) == 1:
        b = active[0]
        return Verdict(BOUND, f"single active Feishu alias {b.open_id} in application {b.app_id}", b)
    if len(active) > 1:
        apps = ", ".join(sorted({b.app_id for b in active}))
        return _unbound(f"ambiguous: {len(active)} active Feishu aliases (applications {apps}); "
                        "leave one active or bind the schedule by recreating it from Feishu")
    if mine:
        return _unbound("no active Feishu alias: only revoked aliases; the creator must bind again")
    return _unbound(f"no Feishu alias: {principal.name!r} has never been bound to a Feishu user")


def decide(schedule: Any, principal: Any, token: Any, bindings: Iterable[Any], cutoff: datetime) -> Verdict:
    """Decide one schedule: bound to its single active alias, or unbound (or ignored) with the reason."""
    ignored = in_scope(schedule, cutoff)
    if ignored is not None:
        return ignored
    refusal = _receipt_refusal(schedule, principal, token) or _actor_refusal(schedule, principal)
    if refusal is not None:
        return _unbound(refusal)
    return _alias(principal, bindings)
