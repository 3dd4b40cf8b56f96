"""The engine × permission_policy table and the normalization of native permission flags."""
from __future__ import annotations

import pytest

from hub.domain.policy import (DEFAULT_POLICY, ENGINE_CAPS, POLICIES, normalize_native_args,
                               supported_policies)
from hub.errors import Invalid

PI_ONLY = "engine pi supports permission_policy policy-allow only; drop permission_policy or pick another profile"

# Every cell: (engine, policy) → (flags added, env added as root, env added otherwise) or the refusal.
CELLS = {
    # Claude: native bypass for policy-allow (root needs IS_SANDBOX=1), the native approval path routed to
    # stdio for escalate-to-main, the native deny mode for deny-all.
    ("claude", "policy-allow"): (["--permission-mode", "bypassPermissions"], {"IS_SANDBOX": "1"}, {}),
    ("claude", "escalate-to-main"): (["--permission-mode", "default", "--permission-prompt-tool", "stdio"], {}, {}),
    ("claude", "deny-all"): (["--permission-mode", "dontAsk"], {}, {}),
    # Codex: danger-full-access for allow and escalate (never / on-request); read-only for deny-all.
    ("codex", "policy-allow"): (["--sandbox", "danger-full-access", "-c", "approval_policy=never"], {}, {}),
    ("codex", "escalate-to-main"): (["--sandbox", "danger-full-access", "-c", "approval_policy=on-request"], {}, {}),
    ("codex", "deny-all"): (["--sandbox", "read-only", "-c", "approval_policy=never"], {}, {}),
    # Pi has no permission capability: policy-allow only, restrictive policies refused before launch.
    ("pi", "policy-allow"): ([], {}, {}),
    ("pi", "escalate-to-main"): PI_ONLY,
    ("pi", "deny-all"): PI_ONLY,
    # The scripted engine raises no approval requests: every policy is enforced trivially.
    ("scripted", "policy-allow"): ([], {}, {}),
    ("scripted", "escalate-to-main"): ([], {}, {}),
    ("scripted", "deny-all"): ([], {}, {}),
}


def test_the_table_has_one_row_per_engine_and_a_cell_for_every_policy():
    assert set(ENGINE_CAPS) == {"claude", "codex", "pi", "scripted"}
    assert set(CELLS) == {(e, p) for e in ENGINE_CAPS for p in POLICIES}


@pytest.mark.parametrize("engine,policy", sorted(CELLS))
@pytest.mark.parametrize("as_root", [True, False])
def test_each_engine_and_policy_cell_adds_its_native_flags_or_is_refused(engine, policy, as_root):
    expected = CELLS[(engine, policy)]
    if isinstance(expected, str):
        with pytest.raises(Invalid) as err:
            normalize_native_args(engine, policy, [], as_root=as_root)
        assert err.value.message == expected
        return
    flags, root_env, env = expected
    launch = normalize_native_args(engine, policy, [], as_root=as_root)
    assert launch.args == flags
    assert launch.env == (root_env if as_root else env)


def test_the_default_policy_is_policy_allow_and_every_engine_enforces_it():
    assert DEFAULT_POLICY == "policy-allow"
    assert all("policy-allow" in supported_policies(e) for e in ENGINE_CAPS)
    assert normalize_native_args("codex", None, [], as_root=False).args == CELLS[("codex", "policy-allow")][0]


def test_an_unknown_policy_is_refused_naming_the_choices():
    with pytest.raises(Invalid) as err:
        normalize_native_args("claude", "ask-me", [], as_root=False)
    assert err.value.message == ("unknown permission_policy 'ask-me'; "
                                 "use one of policy-allow, escalate-to-main, deny-all")


def test_an_unknown_engine_is_refused_naming_the_known_ones():
    with pytest.raises(Invalid) as err:
        normalize_native_args("gemini", "policy-allow", [], as_root=False)
    assert err.value.message == "unknown engine 'gemini'; use one of claude, codex, pi, scripted"


NORMALIZATION = [
    # (engine, policy, extra_args, expected args after normalization)
    ("claude", "deny-all",
     ["--add-dir", "/data", "--dangerously-skip-permissions", "--max-turns", "5", "--permission-mode", "acceptEdits",
      "--append-system-prompt", "be brief", "--permission-mode=plan", "--allow-dangerously-skip-permissions",
      "--permission-prompt-tool", "mcp__gate__ask", "--permission-prompt-tool=stdio", "--disallowedTools", "WebFetch"],
     ["--permission-mode", "dontAsk",
      "--add-dir", "/data", "--max-turns", "5", "--append-system-prompt", "be brief", "--disallowedTools", "WebFetch"]),
    ("claude", "policy-allow", ["--verbose", "--permission-mode", "default", "--mcp-config", "m.json"],
     ["--permission-mode", "bypassPermissions", "--verbose", "--mcp-config", "m.json"]),
    ("codex", "escalate-to-main",
     ["--skip-git-repo-check", "--yolo", "-s", "workspace-write", "--add-dir", "/data", "--sandbox=read-only",
      "-sread-only", "-c", "approval_policy=untrusted", "-c", "model_verbosity=high", "--config",
      "approval_policy='never'",
      "-capproval_policy=on-failure", "--config=sandbox_mode=read-only", "-c",
      "sandbox_workspace_write.network_access=true",
      "--dangerously-bypass-approvals-and-sandbox", "--full-auto", "--not-so-yolo", "-a", "never",
      "--ask-for-approval=on-request", "--color", "never"],
     ["--sandbox", "danger-full-access", "-c", "approval_policy=on-request",
      "--skip-git-repo-check", "--add-dir", "/data", "-c", "model_verbosity=high", "--color", "never"]),
    ("pi", "policy-allow", ["--tools", "read,grep", "--provider", "anthropic"],
     ["--tools", "read,grep", "--provider", "anthropic"]),
]


@pytest.mark.parametrize("engine,policy,extra,expected", NORMALIZATION,
                         ids=[f"{e}-{p}" for e, p, _, _ in NORMALIZATION])
def test_native_permission_flags_are_replaced_by_the_policy_and_other_args_keep_their_order(engine, policy, extra,
                                                                                            expected):
    assert normalize_native_args(engine, policy, extra, as_root=False).args == expected


@pytest.mark.parametrize("engine,policy,extra,expected", NORMALIZATION,
                         ids=[f"{e}-{p}" for e, p, _, _ in NORMALIZATION])
def test_normalizing_normalized_args_changes_nothing(engine, policy, extra, expected):
    # A frozen snapshot's native_args can be normalized again (retries, instances) without drift.
    assert normalize_native_args(engine, policy, expected, as_root=False).args == expected


def test_claude_pre_approved_tools_are_dropped_under_deny_all_only():
    extra = ["--allowedTools", "Bash(git:*)", "Edit", "--add-dir", "/d", "--allowed-tools=Write"]
    assert normalize_native_args("claude", "deny-all", extra, as_root=False).args == [
        "--permission-mode", "dontAsk", "--add-dir", "/d"]
    assert normalize_native_args("claude", "escalate-to-main", extra, as_root=False).args == [
        "--permission-mode", "default", "--permission-prompt-tool", "stdio", *extra]


def test_a_permission_flag_missing_its_value_is_still_dropped():
    assert normalize_native_args("codex", "deny-all", ["--add-dir", "x", "-s"], as_root=False).args == [
        "--sandbox", "read-only", "-c", "approval_policy=never", "--add-dir", "x"]


@pytest.mark.parametrize("engine,arg,owner", [
    ("claude", "--output-format=text", "the event stream"),
    ("claude", "--model", "the model field"),
    ("claude", "--resume", "the resume handle"),
    ("codex", "--json", "the event stream"),
    ("codex", "-m", "the model field"),
    ("codex", "-mgpt-5", "the model field"),
    ("pi", "--mode", "the event stream"),
    ("pi", "--session", "the resume handle"),
])
def test_options_the_adapter_sets_are_refused_in_extra_args_naming_the_field(engine, arg, owner):
    with pytest.raises(Invalid) as err:
        normalize_native_args(engine, "policy-allow", [arg, "x"], as_root=False)
    name = arg.split("=")[0] if arg.startswith("--") else arg[:2]
    assert err.value.message == (f"extra_args for engine {engine} may not set {name}: amux sets it from {owner}; "
                                 "remove it from extra_args")


def test_a_bare_double_dash_is_refused_because_amux_passes_the_prompt():
    with pytest.raises(Invalid) as err:
        normalize_native_args("pi", "policy-allow", ["--", "more prompt"], as_root=False)
    assert "may not contain a bare '--'" in err.value.message


def test_extra_args_must_be_strings():
    with pytest.raises(Invalid) as err:
        normalize_native_args("codex", "policy-allow", ["--add-dir", 3], as_root=False)  # type: ignore[list-item]
    assert err.value.message == "extra_args must be a list of strings; quote each argument separately"
