"""Admission: turn a submission into a frozen execution snapshot, or refuse it naming the fix."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, Awaitable, Sequence, TypeVar

from ...clock import Clock
from ...config import HubSettings, ProfileSettings
from ...domain import isolation, scripted
from ...domain.choices import check_task_choices
from ...domain.limits import Limits
from ...domain.placement import LAUNCH_PLATFORMS, platforms_text
from ...domain.policy import DEFAULT_POLICY, POLICIES, NativeLaunch, normalize_native_args
from ...domain.resolution import Choices, Preset, Resolved, SessionContext, resolve
from ...domain.states import RuntimeStatus
from ...errors import Invalid
from ...store.db import Connection, Row, StoreError
from ...store.registry import SqlRegistryStore
from ..auth.service import Caller
from ..auth.credentials import CredentialService
from .profiles import ProfileService, ResolvedProfile

ENGINE_CHECK_S = 2.0  # how long a passing "some runtime offers this engine" check stands (`_admit_engine`)
T = TypeVar("T")


@dataclass(frozen=True)
class _Choice:
    """What admission resolved of a submission's choices before its prompt and credentials are checked."""

    profile: ResolvedProfile
    policy: str
    native: NativeLaunch
    resolved: Resolved
    runtime: Row | None
    isolation: str | None = None
    limits: dict[str, Any] | None = None  # the profile's and the request's, the lower of each (hub.domain.limits)


def _plain(value: Any) -> Any:
    """A request part as plain data (an MCP argument arrives as its model)."""
    return value.model_dump(exclude_none=True) if hasattr(value, "model_dump") else value


async def _outcome(step: Awaitable[T]) -> T | Exception:
    """Await `step`; return its refusal instead of raising it (a database error is raised)."""
    try:
        return await step
    except StoreError:
        raise
    except Exception as e:  # noqa: BLE001 — remembered for every item that shares the step
        return e


def _raise_or(value: T | Exception) -> T:
    """Raise a remembered refusal, or return the value."""
    if isinstance(value, Exception):
        raise value
    return value


@dataclass(kw_only=True)
class SubmitRequest:
    """What a caller asks for: a prompt, a name and `hub.domain.choices.TaskChoices`' fields, which admission
    validates against that model's bounds; omitted (None) choices are resolved at admission."""

    prompt: str
    profile: str | None = None
    runtime: str | None = None
    model: str | None = None
    extra_args: list[str] | None = None
    timeout_s: float | None = None
    name: str | None = None
    reasoning_effort: str | None = None
    permission_policy: str | None = None
    credential_profile: str | None = None
    isolation: str | None = None  # linux-dac | userns | process; omitted: the strongest mode an eligible runtime offers
    limits: Any = None  # {memory_max, pids_max, cpu_max}: may only lower the profile's and the runner's


class Admission:
    """Validate and resolve execution choices with one set of rules (tasks, and schedules at each trigger)."""

    def __init__(self, profiles: ProfileService, credentials: CredentialService, hub: HubSettings,
                 profile_settings: ProfileSettings, *, clock: Clock | None = None) -> None:
        self.profiles = profiles
        self.credentials = credentials
        self.hub = hub
        self.ps = profile_settings
        self.runtimes = SqlRegistryStore(profiles.db)  # the constructor keeps its signature: the profiles' database
        self.clock = clock
        self._engines_ok: dict[str, datetime] = {}  # engine -> until when its last passing check stands

    def presets(self) -> dict[str, Preset]:
        """Return configured builtin launch presets."""
        return {k: Preset(v.runtime, v.model, v.reasoning_effort) for k, v in self.ps.presets.items()}

    def _shape(self, req: SubmitRequest, origin: str) -> tuple[list[str], float]:
        if origin in ("session", "instance") and req.prompt == "":
            pass  # a session or instance is admitted before its first prompt; each prompt is checked when sent
        elif not isinstance(req.prompt, str) or not req.prompt.strip():
            raise Invalid("prompt is empty; pass the work to do as `prompt`")
        size = len(req.prompt.encode())
        if size > self.hub.max_prompt_bytes:
            raise Invalid(f"prompt is {size} bytes; the limit is {self.hub.max_prompt_bytes} — "
                          "put large inputs in files and reference them")
        choices = check_task_choices(req)  # the bounds every door publishes (hub/domain/choices.py)
        for key in ("model", "runtime", "profile", "reasoning_effort", "permission_policy", "credential_profile"):
            value = getattr(choices, key)
            if value is not None and not value.strip():
                raise Invalid(f"{key} must be a non-empty string of at most 200 characters, or omitted")
        if req.name is not None and (not isinstance(req.name, str) or not req.name.strip() or len(req.name) > 200):
            raise Invalid("name must be a non-empty string of at most 200 characters, or omitted")
        args = choices.extra_args or []
        timeout = self.hub.default_timeout_s if choices.timeout_s is None else choices.timeout_s
        return list(args), float(timeout)

    async def _runtime(self, conn: Connection, ref: str) -> Row:
        row = await self.runtimes.find(conn, ref)
        if row is None:
            names = await self.runtimes.names(conn, 20)
            raise Invalid(f"unknown runtime {ref!r}; registered runtimes: "
                          f"{', '.join(names) or 'none — start one with `amux runner`'}")
        return row

    async def freeze(self, conn: Connection, caller: Caller, req: SubmitRequest, *, origin: str = "submit",
                     session: SessionContext | None = None) -> dict[str, Any]:
        """Return the resolved execution snapshot for `req` (origin: submit | run | schedule | session)."""
        args, timeout = self._shape(req, origin)
        choice = await self._choose(conn, req, args, origin, session)
        self.check_prompt(choice.profile.engine, req.prompt)
        cred = await self._credential(conn, caller, req, choice.profile)
        return self._snapshot(choice, cred, args, timeout, origin)

    async def freeze_many(self, conn: Connection, items: Sequence[tuple[Caller, SubmitRequest]], *,
                          origin: str) -> list[dict[str, Any] | Exception]:
        """Freeze each (caller, request) as `freeze` would (no session), in order: a snapshot, or the refusal it
        raised. The choices are resolved once per distinct set of them and the credentials checked once per distinct
        caller and credential profile, on the same connection; the shape and the prompt are checked per item, each
        snapshot is its own. A database error is raised, never returned (the whole batch is tried again)."""
        choices: dict[tuple, _Choice | Exception] = {}
        creds: dict[tuple, dict[str, Any] | None | Exception] = {}
        out: list[dict[str, Any] | Exception] = []
        for caller, req in items:
            try:
                args, timeout = self._shape(req, origin)
                key = (req.profile, req.runtime, req.model, req.reasoning_effort, req.permission_policy, tuple(args),
                       req.isolation, repr(_plain(req.limits)))
                if key not in choices:
                    choices[key] = await _outcome(self._choose(conn, req, args, origin, None))
                choice = _raise_or(choices[key])
                self.check_prompt(choice.profile.engine, req.prompt)
                ckey = (caller.principal_id, caller.principal, req.credential_profile, key)
                if ckey not in creds:
                    creds[ckey] = await _outcome(self._credential(conn, caller, req, choice.profile))
                out.append(self._snapshot(choice, _raise_or(creds[ckey]), args, timeout, origin))
            except StoreError:
                raise
            except Exception as e:  # noqa: BLE001 — a refusal is the item's answer
                out.append(e)
        return out

    async def _choose(self, conn: Connection, req: SubmitRequest, args: list[str], origin: str,
                      session: SessionContext | None) -> _Choice:
        """Resolve profile, policy, native arguments, runtime, model and effort, and admit them (not the prompt and
        not the credentials: those are the caller's)."""
        profile = await self.profiles.get(conn, req.profile or self.ps.default_profile)
        policy = req.permission_policy or DEFAULT_POLICY
        if policy not in POLICIES:
            raise Invalid(f"permission_policy {policy!r} is unknown; use one of {', '.join(POLICIES)}")
        if policy == "escalate-to-main" and origin in ("run", "schedule"):
            what = "blocking task_run" if origin == "run" else "scheduled subtasks"
            raise Invalid(f"escalate-to-main is unavailable for {what}: nobody could answer its permission requests; "
                          "use task_submit and answer with permission_respond, or choose policy-allow / deny-all")
        if profile.manifest and policy not in profile.manifest.policy.permission_policies:
            allowed = ", ".join(profile.manifest.policy.permission_policies)
            raise Invalid(f"profile {profile.name!r} allows permission_policy {allowed} only")
        native = normalize_native_args(profile.engine, policy, args, as_root=False)
        resolved = resolve(profile.view(), Choices(req.runtime, req.model, req.reasoning_effort),
                           self.presets(), self.ps.default_preset, session)
        runtime = await self._runtime(conn, resolved.runtime) if resolved.runtime else None
        if runtime is not None:
            explicit = resolved.model if resolved.sources["model"] == "explicit" else None
            self._admit_runtime(runtime, profile.engine, explicit)
        else:
            await self._admit_engine(conn, profile.engine)
        if profile.manifest and profile.manifest.expert.authoring == "local":
            await self._require_authoring(conn, profile.name)
        mode = await self._isolation(conn, req.isolation, profile.engine, runtime,
                                     subprocess=profile.engine == "scripted" and "--subprocess" in args)
        asked = Limits.parse(_plain(req.limits))
        if profile.manifest and profile.manifest.limits is not None:
            asked = asked.lowest(Limits.parse(profile.manifest.limits.model_dump(exclude_none=True),
                                              f"profile {profile.name!r} limits"))
        return _Choice(profile, policy, native, resolved, runtime, mode, asked.snapshot())

    async def _isolation(self, conn: Connection, asked: str | None, engine: str, runtime: Row | None, *,
                         subprocess: bool) -> str | None:
        """Resolve the execution mode: the one asked for, if some runtime that runs the engine offers it; else the
        strongest one offered (`linux-dac` wherever a runner can provide it, else `userns`); refused, naming the
        fix, when the runtimes that run the engine offer no mode at all. None for the in-process scripted
        engine, which launches no child."""
        if asked is not None and asked not in isolation.MODES:
            raise Invalid(f"isolation {asked!r} is unknown; use one of {', '.join(isolation.MODES)}, or omit it")
        if not isolation.needs_boundary({"engine": engine, "subprocess": subprocess}):
            return asked
        offers = ({runtime.name: runtime.capabilities} if runtime is not None
                  else await self.runtimes.capabilities_offering(conn, engine))
        if asked is None:
            if offers and not any(isolation.offered(caps) for caps in offers.values()):
                raise Invalid(isolation.no_mode_text(engine, offers.values()))  # queued, it would wait for ever
            return isolation.default_mode(offers.values())
        if offers and not any(asked in isolation.offered(caps) for caps in offers.values()):
            others = sorted({f"{name} ({', '.join(isolation.offered(caps)) or 'no mode'})"
                             for name, caps in offers.items()})[:10]
            why = isolation.why_not(next(iter(offers.values())), asked)
            raise Invalid(f"no runtime that runs engine {engine} offers isolation {asked} ({why}); runtimes and the "
                          f"modes they offer: {', '.join(others)}; omit isolation or pick one of those modes")
        return asked

    async def _credential(self, conn: Connection, caller: Caller, req: SubmitRequest,
                          profile: ResolvedProfile) -> dict[str, Any] | None:
        """Return the credential profile's names the caller holds values for (None: no credential profile)."""
        cred_name = req.credential_profile or (profile.manifest.credential_profile if profile.manifest else None)
        if not cred_name:
            return None
        env_names = await self.credentials.check_complete(conn, cred_name, caller.principal_id, caller.principal)
        return {"name": cred_name, "env": env_names}  # names only: values never enter a snapshot

    @staticmethod
    def _snapshot(c: _Choice, cred: dict[str, Any] | None, args: list[str], timeout: float,
                  origin: str) -> dict[str, Any]:
        """Assemble one snapshot; its containers are its own (snapshots frozen from one resolution share none)."""
        return {
            "profile": {"ref": c.profile.name, "kind": c.profile.kind, "digest": c.profile.digest,
                        "instructions": c.profile.manifest.expert.instructions if c.profile.manifest else ""},
            "engine": c.profile.engine,
            "runtime": c.runtime.name if c.runtime is not None else None,
            "model": c.resolved.model,
            "reasoning_effort": c.resolved.reasoning_effort,
            "resolution": dict(c.resolved.sources),
            "extra_args": list(args),
            "native_args": list(c.native.args),
            "native_env": dict(c.native.env),
            "permission_policy": c.policy,
            "credential_profile": None if cred is None else {"name": cred["name"], "env": list(cred["env"])},
            "timeout_s": timeout,
            "platforms": list(LAUNCH_PLATFORMS),  # placement launches it only there, named runtime or not
            "isolation": c.isolation,  # linux-dac | userns | process (None: the in-process scripted engine, no child)
            # asked for by the profile and the request; the runner applies the lower of these and its own
            "limits": None if c.limits is None else dict(c.limits),
            "origin": origin,  # submit | run | schedule | session: which door admitted it (provenance)
            "subprocess": c.profile.engine == "scripted" and "--subprocess" in args,
            "resume_handle": None,
        }

    def check_prompt(self, engine: str, prompt: str) -> None:
        """Refuse a prompt the engine can't take (a bad script for `scripted`) now, not on the runner."""
        if engine == "scripted":
            scripted.parse(prompt)

    def _admit_runtime(self, runtime: Any, engine: str, explicit_model: str | None) -> None:
        """Runtime admission: engine, platform support and workspace access, before launch."""
        caps = runtime.capabilities
        if engine not in caps.get("engines", []):
            raise Invalid(f"runtime {runtime.name!r} cannot launch engine {engine!r}; it offers "
                          f"{', '.join(caps.get('engines', [])) or 'none'} — pick another runtime or omit it")
        if caps.get("platform") not in LAUNCH_PLATFORMS:
            raise Invalid(f"runtime {runtime.name!r} runs on {caps.get('platform')!r}, which amux cannot launch agents "
                          f"on; pick a {platforms_text(LAUNCH_PLATFORMS)} runtime")
        if not caps.get("workspace_writable", False):
            raise Invalid(f"runtime {runtime.name!r} cannot write its workspace root {caps.get('workspace_root')!r}; "
                          "fix its permissions or pass --workspace-root")
        fixed = (caps.get("fixed_models") or {}).get(engine)
        if explicit_model is not None and fixed is not None and explicit_model != fixed:
            raise Invalid(f"runtime {runtime.name!r} serves only model {fixed!r} for {engine}; "
                          "omit model or pick another runtime")

    async def _admit_engine(self, conn: Connection, engine: str) -> None:
        """Without a named runtime: some registered runtime (any status) must offer the engine, and not every one of
        them may report a platform amux cannot launch agents on (placement checks each runtime again).

        A passing check stands for `ENGINE_CHECK_S` (every submission read every runtime's capabilities): a runtime
        deregistered meanwhile on another replica is noticed by placement, which fails the task naming why once
        `hub.queue_timeout_s` passes. A refusal is never remembered: a runtime registered a moment ago counts at once.
        """
        now = self.clock.now() if self.clock is not None else None
        if now is not None and self._engines_ok.get(engine, now) > now:
            return
        offers = await self.runtimes.platforms_offering(conn, engine)
        if not offers:
            raise Invalid(f"no registered runtime offers engine {engine!r}; "
                          "start `amux runner` on a machine that has it")
        if all(platform is not None and platform not in LAUNCH_PLATFORMS for platform in offers.values()):
            where = ", ".join(f"{name} runs on {platform}" for name, platform in sorted(offers.items())[:5])
            raise Invalid(f"no registered runtime can launch engine {engine!r}: {where}, and amux launches agents on "
                          f"{platforms_text(LAUNCH_PLATFORMS)} only; start `amux runner` on such a machine")
        if now is not None:
            self._engines_ok[engine] = now + timedelta(seconds=ENGINE_CHECK_S)

    async def _require_authoring(self, conn: Connection, profile_name: str) -> None:
        """Local expert authoring fails closed without an explicitly configured compatible runtime."""
        name = self.ps.authoring_runtime
        if not name:
            raise Invalid(f"profile {profile_name!r} uses local expert authoring, but no authoring runtime is "
                          "configured; set profiles.authoring_runtime to a runner that offers authoring "
                          "(builtin profiles still run)")
        row = await self.runtimes.by_name(conn, name)
        if row is None or row.status != RuntimeStatus.ONLINE or not row.capabilities.get("authoring"):
            raise Invalid(f"profile {profile_name!r} needs the authoring runtime {name!r}, which is not online with "
                          "the authoring capability; start it, or use a builtin profile")
