"""Permission policy: the one table that maps engine × permission_policy to native launch flags.

`permission_policy` is a task's single permission setting. It decides both the native launch
permissions (flags frozen into the snapshot's `native_args`) and how the runner answers the
engine's approval requests (`APPROVAL_REPLIES`). Native permission flags a caller put in
`extra_args` are removed and replaced by the policy's own; every other argument keeps its order.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, Mapping, Sequence

from ..errors import Invalid

PolicyName = Literal["policy-allow", "escalate-to-main", "deny-all"]
POLICIES: tuple[PolicyName, ...] = ("policy-allow", "escalate-to-main", "deny-all")
DEFAULT_POLICY = "policy-allow"

# How the runner answers an approval request the engine raises: allow it, ask the main session, deny it.
APPROVAL_REPLIES: Mapping[str, str] = {"policy-allow": "allow", "escalate-to-main": "ask", "deny-all": "deny"}


@dataclass(frozen=True)
class Flag:
    """A native command-line option that grants or withholds permissions.

    `arity` is "bool" (no value), "value" (one value, `--x v` or `--x=v`, short `-xv`) or
    "variadic" (values up to the next option). `config_keys`, for `-c key=value` style options,
    limits the match to those keys (a trailing `*` matches a prefix). `policies`, when set,
    removes the flag only under those policies.
    """

    names: tuple[str, ...]
    arity: str = "bool"
    config_keys: tuple[str, ...] = ()
    policies: frozenset[str] | None = None


@dataclass(frozen=True)
class PolicyCell:
    """What one policy means for one engine: flags to add, and env to add when running as root."""

    args: tuple[str, ...] = ()
    root_env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class EngineCaps:
    """One engine's row: the policies it can enforce, the native flags it recognizes, the flags amux owns."""

    cells: Mapping[str, PolicyCell]
    permission_flags: tuple[Flag, ...] = ()
    # Options the adapter sets itself from the snapshot (output format, model, resume): refused in extra_args.
    reserved: Mapping[str, str] = field(default_factory=dict)


_CLAUDE_BYPASS = PolicyCell(("--permission-mode", "bypassPermissions"), {"IS_SANDBOX": "1"})
_CODEX_SANDBOX = ("--sandbox", "danger-full-access")

ENGINE_CAPS: dict[str, EngineCaps] = {
    # Claude Code permission modes: default | acceptEdits | plan | dontAsk | bypassPermissions.
    # bypass refuses to run as root unless IS_SANDBOX=1; dontAsk denies every call that would prompt;
    # `--permission-prompt-tool stdio` routes each prompt to stdin/stdout as a `can_use_tool` control request.
    "claude": EngineCaps(
        cells={
            "policy-allow": _CLAUDE_BYPASS,
            "escalate-to-main": PolicyCell(("--permission-mode", "default", "--permission-prompt-tool", "stdio")),
            "deny-all": PolicyCell(("--permission-mode", "dontAsk")),
        },
        permission_flags=(
            Flag(("--dangerously-skip-permissions", "--allow-dangerously-skip-permissions")),
            Flag(("--permission-mode", "--permission-prompt-tool"), "value"),
            # Pre-approved tools would run under dontAsk; deny-all means nothing is pre-approved.
            Flag(("--allowedTools", "--allowed-tools"), "variadic", policies=frozenset({"deny-all"})),
        ),
        reserved={
            "-p": "the prompt", "--print": "the prompt", "--output-format": "the event stream",
            "--input-format": "the event stream", "--model": "the model field",
            "--effort": "the reasoning_effort field",
            "--resume": "the resume handle", "-r": "the resume handle", "--continue": "the resume handle",
            "-c": "the resume handle", "--session-id": "the resume handle",
        },
    ),
    # Codex: `codex exec` takes -s/--sandbox and `-c approval_policy=…`; --yolo and friends bypass both.
    "codex": EngineCaps(
        cells={
            "policy-allow": PolicyCell(_CODEX_SANDBOX + ("-c", "approval_policy=never")),
            "escalate-to-main": PolicyCell(_CODEX_SANDBOX + ("-c", "approval_policy=on-request")),
            # read-only with `never`: whatever needs more than read access fails back to the model.
            "deny-all": PolicyCell(("--sandbox", "read-only", "-c", "approval_policy=never")),
        },
        permission_flags=(
            Flag(("--dangerously-bypass-approvals-and-sandbox", "--yolo", "--full-auto", "--not-so-yolo")),
            Flag(("--sandbox", "-s", "--ask-for-approval", "-a"), "value"),
            Flag(("-c", "--config"), "value",
                 config_keys=("approval_policy", "ask_for_approval", "sandbox_mode", "sandbox_workspace_write*",
                              "approvals_reviewer")),
        ),
        reserved={
            "--json": "the event stream", "--experimental-json": "the event stream",
            "-m": "the model field", "--model": "the model field",
        },
    ),
    # Pi has no permission system at all: it can only run with everything allowed.
    "pi": EngineCaps(
        cells={"policy-allow": PolicyCell()},
        reserved={
            "--mode": "the event stream", "-p": "the prompt", "--print": "the prompt", "--model": "the model field",
            "--thinking": "the reasoning_effort field", "--session": "the resume handle",
            "-c": "the resume handle", "--continue": "the resume handle", "-r": "the resume handle",
            "--resume": "the resume handle",
        },
    ),
    # The built-in offline engine raises no approval requests, so every policy is trivially enforced.
    "scripted": EngineCaps(cells={p: PolicyCell() for p in POLICIES}),
}


@dataclass(frozen=True)
class NativeLaunch:
    """The normalized native arguments and the environment a launch adds."""

    args: list[str]
    env: dict[str, str]


def supported_policies(engine: str) -> tuple[str, ...]:
    """Return the policies `engine` can enforce, in POLICIES order."""
    caps = _caps(engine)
    return tuple(p for p in POLICIES if p in caps.cells)


def normalize_native_args(engine: str, policy: str | None, extra_args: Sequence[str] | None, *,
                          as_root: bool) -> NativeLaunch:
    """Strip native permission flags from `extra_args` and add the policy's own; keep the rest in order."""
    caps = _caps(engine)
    policy = DEFAULT_POLICY if policy is None else policy
    if policy not in POLICIES:
        raise Invalid(f"unknown permission_policy {policy!r}; use one of {', '.join(POLICIES)}")
    cell = caps.cells.get(policy)
    if cell is None:
        allowed = supported_policies(engine)
        only = " only" if len(allowed) == 1 else ""
        raise Invalid(f"engine {engine} supports permission_policy {', '.join(allowed)}{only}; "
                      f"drop permission_policy or pick another profile")
    args = list(extra_args or [])
    if not all(isinstance(a, str) for a in args):
        raise Invalid("extra_args must be a list of strings; quote each argument separately")
    kept = _strip(args, [f for f in caps.permission_flags if f.policies is None or policy in f.policies])
    _refuse_reserved(engine, caps, kept)
    env = dict(cell.root_env) if as_root else {}
    return NativeLaunch(args=[*cell.args, *kept], env=env)


def _caps(engine: str) -> EngineCaps:
    caps = ENGINE_CAPS.get(engine)
    if caps is None:
        raise Invalid(f"unknown engine {engine!r}; use one of {', '.join(sorted(ENGINE_CAPS))}")
    return caps


def _strip(args: list[str], flags: list[Flag]) -> list[str]:
    """Drop every occurrence of `flags` (with their values); a bare `--` ends option parsing."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            out.extend(args[i:])
            break
        taken = _match(arg, args[i + 1:], flags)
        if taken:
            i += taken
        else:
            out.append(arg)
            i += 1
    return out


def _match(arg: str, rest: list[str], flags: list[Flag]) -> int:
    """Return how many arguments (this one and its values) a permission flag occupies, or 0."""
    for flag in flags:
        for name in flag.names:
            if flag.arity == "bool":
                if arg == name:
                    return 1
                continue
            if arg == name:
                value, used = (rest[0] if rest else ""), min(2, 1 + len(rest))
            elif name.startswith("--") and arg.startswith(name + "="):
                value, used = arg[len(name) + 1:], 1
            elif len(name) == 2 and not arg.startswith("--") and arg.startswith(name) and len(arg) > 2:
                value, used = arg[2:], 1  # a short option with its value attached: -sread-only
            else:
                continue
            if flag.config_keys and not _config_key_matches(value, flag.config_keys):
                continue
            if flag.arity == "variadic":  # values run up to the next option
                used = 1 + next((n for n, a in enumerate(rest) if a.startswith("-")), len(rest))
            return used
    return 0


def _config_key_matches(value: str, keys: tuple[str, ...]) -> bool:
    key = value.split("=", 1)[0].strip()
    return any(key.startswith(k[:-1]) if k.endswith("*") else key == k for k in keys)


def _refuse_reserved(engine: str, caps: EngineCaps, args: list[str]) -> None:
    for arg in args:
        if arg == "--":
            raise Invalid(f"extra_args for engine {engine} may not contain a bare '--'; "
                          "amux passes the prompt itself")
        name = arg.split("=", 1)[0] if arg.startswith("--") else arg[:2] if arg.startswith("-") else arg
        if name in caps.reserved:
            raise Invalid(f"extra_args for engine {engine} may not set {name}: amux sets it from "
                          f"{caps.reserved[name]}; remove it from extra_args")
