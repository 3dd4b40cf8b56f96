"""The creator-recovery rule, table-driven: one commented case per clause of the upgrade paragraph."""
from __future__ import annotations

from datetime import datetime, timedelta, timezone
from types import SimpleNamespace as Row

import pytest

from hub.domain import recovery as r

CUTOFF = datetime(2026, 3, 1, tzinfo=timezone.utc)
BEFORE = CUTOFF - timedelta(days=30)
ALICE = Row(id="pr_alice", kind="user", name="alice")
TOKEN = Row(id="tok_a", principal_id="pr_alice")


def sched(**kw) -> Row:
    prov = {"source": "cli", "token_id": "tok_a", "label": "cli", "principal": "alice"}
    base = dict(id="sch_1", type="subtask", deleted_at=None, creator_binding_id=None, creator_id="pr_alice",
                created_at=BEFORE, provenance=prov)
    if "prov" in kw:
        base["provenance"] = kw.pop("prov")
    if "prov_extra" in kw:
        base["provenance"] = {**prov, **kw.pop("prov_extra")}
    return Row(**{**base, **kw})


def alias(app: str, status: str = "active", principal_id: str = "pr_alice", n: int = 1) -> Row:
    return Row(id=f"bnd_{app}_{n}", principal_id=principal_id, app_id=app, open_id=f"ou_{app}_{n}", status=status)


CASES = [
    # a clean single alias with a valid receipt and a human origin actor: bound to that alias
    ("clean_single_alias", sched(), ALICE, TOKEN, [alias("cli_a")], "bound", "single active Feishu alias"),
    # "exactly one active Feishu alias across applications": two apps → ambiguous, unbound
    ("two_aliases_two_apps", sched(), ALICE, TOKEN, [alias("cli_a"), alias("cli_b")], "unbound", "ambiguous"),
    # two aliases in one application are just as ambiguous
    ("two_aliases_one_app", sched(), ALICE, TOKEN, [alias("cli_a"), alias("cli_a", n=2)], "unbound", "ambiguous"),
    # a revoked alias is not an active one
    ("revoked_alias_only", sched(), ALICE, TOKEN, [alias("cli_a", "revoked")], "unbound", "only revoked"),
    # revoked aliases do not count against the one active alias
    ("revoked_plus_one_active", sched(), ALICE, TOKEN, [alias("cli_a", "revoked"), alias("cli_b")], "bound", "cli_b"),
    # no alias at all
    ("never_bound", sched(), ALICE, TOKEN, [], "unbound", "never been bound"),
    # another principal's alias is never borrowed
    ("someone_elses_alias", sched(), ALICE, TOKEN, [alias("cli_a", principal_id="pr_bob")], "unbound",
     "never been bound"),
    # "its human origin actor": a service principal is not a person
    ("service_created", sched(), Row(id="pr_alice", kind="service", name="alice"), TOKEN, [alias("cli_a")],
     "unbound", "service principal"),
    # … nor is a runtime principal
    ("runtime_created", sched(), Row(id="pr_alice", kind="runtime", name="alice"), TOKEN, [alias("cli_a")],
     "unbound", "runtime principal"),
    # an agent label acting alone (an MCP client) names no human actor
    ("mcp_label_alone", sched(prov_extra={"label": "mcp:Claude"}), ALICE, TOKEN, [alias("cli_a")],
     "unbound", "acting alone"),
    # a child session's token acting alone names no human actor either
    ("session_label_alone", sched(prov_extra={"label": "amux-session:ses_1"}), ALICE, TOKEN, [alias("cli_a")],
     "unbound", "acting alone"),
    # an agent label with a recorded human origin actor who is the creator is recoverable
    ("agent_with_origin_actor", sched(prov_extra={"label": "mcp:Claude", "origin_actor": "alice"}), ALICE, TOKEN,
     [alias("cli_a")], "bound", "single active"),
    # a recorded origin actor who is someone else is refused
    ("origin_actor_mismatch", sched(prov_extra={"origin_actor": "bob"}), ALICE, TOKEN, [alias("cli_a")],
     "unbound", "origin actor"),
    # "a matching owner (if recorded)": a different recorded owner leaves it unbound
    ("owner_mismatch", sched(prov_extra={"owner": "bob"}), ALICE, TOKEN, [alias("cli_a")], "unbound", "owner mismatch"),
    # … and a matching recorded owner is fine
    ("owner_matches", sched(prov_extra={"owner": "alice"}), ALICE, TOKEN, [alias("cli_a")], "bound", "single active"),
    # "an authorization receipt": no provenance at all
    ("no_provenance", sched(prov=None), ALICE, TOKEN, [alias("cli_a")], "unbound", "provenance is missing"),
    # a receipt without the token that authenticated the request
    ("receipt_without_token", sched(prov={"source": "cli", "principal": "alice"}), ALICE, TOKEN, [alias("cli_a")],
     "unbound", "lacks token_id"),
    # "a valid frozen schedule identity": the receipt names another principal than the frozen creator
    ("identity_mismatch", sched(prov_extra={"principal": "bob"}), ALICE, TOKEN, [alias("cli_a")],
     "unbound", "frozen identity mismatch"),
    # the receipt's token no longer exists
    ("token_missing", sched(), ALICE, None, [alias("cli_a")], "unbound", "unverifiable"),
    # the receipt's token was issued to someone else
    ("token_of_another", sched(), ALICE, Row(id="tok_a", principal_id="pr_bob"), [alias("cli_a")],
     "unbound", "another principal"),
    # no frozen creator at all
    ("no_creator", sched(creator_id=None), None, None, [alias("cli_a")], "unbound", "no frozen creator"),
    # "later-created schedules are never included"
    ("after_cutoff", sched(created_at=CUTOFF + timedelta(seconds=1)), ALICE, TOKEN, [alias("cli_a")],
     "ignored", "after the upgrade cutoff"),
    # the cutoff instant itself is still before the upgrade
    ("at_cutoff", sched(created_at=CUTOFF), ALICE, TOKEN, [alias("cli_a")], "bound", "single active"),
    # "existing subtask schedules": session-prompt schedules are out of scope
    ("session_prompt", sched(type="session-prompt"), ALICE, TOKEN, [alias("cli_a")], "ignored", "out of scope"),
    # "without a creator binding": one that has a binding is left as it is
    ("already_bound", sched(creator_binding_id="bnd_x"), ALICE, TOKEN, [alias("cli_a")], "ignored", "already has"),
    # a deleted schedule shows in no personal view
    ("deleted", sched(deleted_at=BEFORE), ALICE, TOKEN, [alias("cli_a")], "ignored", "deleted"),
]


@pytest.mark.parametrize("case, schedule, principal, token, bindings, outcome, reason", CASES,
                         ids=[c[0] for c in CASES])
def test_recovery_rule(case, schedule, principal, token, bindings, outcome, reason):
    v = r.decide(schedule, principal, token, bindings, CUTOFF)
    assert v.outcome == outcome, v.reason
    assert reason in v.reason
    assert (v.binding is not None) == (outcome == "bound")
    if outcome == "bound":
        assert v.binding_id == v.binding.id and v.app_id == v.binding.app_id


def test_naive_timestamps_from_sqlite_compare_as_utc():
    v = r.decide(sched(created_at=BEFORE.replace(tzinfo=None)), ALICE, TOKEN, [alias("cli_a")], CUTOFF)
    assert v.outcome == "bound"
