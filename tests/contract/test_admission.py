"""Admission on both stores: manifests v2, credentials, policies, runtime admission, frozen snapshots."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa

from hub.app import Hub
from hub.config import PresetSettings
from hub.errors import Forbidden, Invalid
from hub.runner import protocol as p
from hub.services.tasks.service import SubmitRequest
from hub.store.tables import metadata, task_runs
from tests.helpers import hub_settings, runner_outgoing

CAPS = {"platform": "linux", "engines": ["scripted", "claude", "codex", "pi"], "workspace_root": "/tmp",
        "workspace_writable": True}
MANIFEST = {"manifest_version": 2, "name": "reviewer", "engine": "claude", "description": "reviews",
            "expert": {"instructions": "You review diffs."}}


@pytest.fixture
async def core(db, clock, tmp_path: Path):
    settings = hub_settings(db.url, tmp_path)
    settings.secret_key = "test-key"
    settings.profiles.presets = {"claude": PresetSettings(runtime="gpu", model="claude-sonnet-4-5")}
    hub = Hub(settings, db, clock)
    hub.admin = await hub.auth.authenticate(await hub.auth.create_token("admin", admin=True))
    for name in ("gpu", "cpu"):
        await hub.registry.register(hub.admin, p.Register(name=name, slots=2, capabilities=CAPS))
    return hub


async def snapshot_of(hub, task_id):
    async with hub.db.read() as conn:
        return (await conn.execute(sa.select(task_runs.c.snapshot).where(task_runs.c.id == task_id))).scalar()


async def submit(hub, caller=None, **kw):
    return (await hub.tasks.submit(caller or hub.admin,
                                   SubmitRequest(prompt=kw.pop("prompt", "review it"), **kw)))["task_id"]


async def test_a_v2_manifest_is_stored_and_a_task_on_it_uses_the_distribution_default_preset(core):
    await core.profiles.add(core.admin, json.dumps(MANIFEST))
    snap = await snapshot_of(core, await submit(core, profile="reviewer"))
    assert (snap["engine"], snap["runtime"], snap["model"]) == ("claude", "gpu", "claude-sonnet-4-5")
    assert snap["profile"]["kind"] == "manifest" and snap["profile"]["instructions"] == "You review diffs."


@pytest.mark.parametrize("manifest, fix", [
    ({"name": "old", "engine": "claude"}, "manifest_version = 2"),
    ({"manifest_version": 1, "name": "old", "engine": "claude", "model": "x"}, "manifest_version = 2"),
    ({"manifest_version": 2, "name": "x", "engine": "gemini"}, "engines are"),
    ({"manifest_version": 2, "name": "x", "engine": "claude", "model": "pinned"}, "model"),
    ({"manifest_version": 2, "name": "claude", "engine": "claude"}, "builtin"),
])
async def test_a_manifest_that_is_not_v2_is_refused_with_what_to_change(core, manifest, fix):
    with pytest.raises(Invalid) as e:
        await core.profiles.add(core.admin, json.dumps(manifest))
    assert fix in e.value.message
    assert len(await core.profiles.list()) == 4  # the builtins only: nothing half-stored


async def test_adding_a_profile_needs_an_admin_token(core):
    alice = await core.auth.authenticate(await core.auth.create_token("alice"))
    with pytest.raises(Forbidden):
        await core.profiles.add(alice, json.dumps(MANIFEST))


async def test_a_toml_manifest_is_accepted(core):
    toml = 'manifest_version = 2\nname = "tomly"\nengine = "codex"\n[expert]\ninstructions = "hi"\n'
    assert (await core.profiles.add(core.admin, toml))["engine"] == "codex"


async def test_local_expert_authoring_fails_closed_without_a_configured_runtime_and_builtins_still_run(core):
    await core.profiles.add(core.admin, json.dumps({**MANIFEST, "name": "author", "expert": {"authoring": "local"}}))
    with pytest.raises(Invalid, match="authoring runtime"):
        await submit(core, profile="author")
    core.settings.profiles.authoring_runtime = "cpu"
    with pytest.raises(Invalid, match="authoring capability"):
        await submit(core, profile="author")
    assert await submit(core, profile="claude")


async def test_the_snapshot_is_frozen_at_admission_and_reused_for_retries(core, clock):
    tid = await submit(core, profile="codex", model="gpt-unlisted-9", extra_args=["--foo", "1"])
    before = await snapshot_of(core, tid)
    core.settings.profiles.presets = {}
    await core.dispatcher.place_once()
    clock.advance(core.settings.hub.reservation_ttl_s + 1)
    await core.dispatcher.reap_once()
    await core.dispatcher.place_once()
    assert await snapshot_of(core, tid) == before and before["model"] == "gpt-unlisted-9"


async def test_an_unknown_policy_or_one_the_engine_cannot_enforce_is_refused_before_launch(core):
    with pytest.raises(Invalid, match="policy-allow"):
        await submit(core, profile="claude", permission_policy="yolo")
    with pytest.raises(Invalid, match="pi"):
        await submit(core, profile="pi", permission_policy="deny-all")


async def test_escalation_is_refused_for_blocking_task_run(core):
    with pytest.raises(Invalid, match="task_run"):
        await core.tasks.submit(core.admin,
                                SubmitRequest(prompt="x", profile="claude", permission_policy="escalate-to-main"),
                                origin="run")


async def test_native_permission_flags_are_normalized_to_the_policy_and_other_args_keep_their_order(core):
    snap = await snapshot_of(core, await submit(core, profile="codex", permission_policy="deny-all",
                                                extra_args=["--a", "--sandbox", "danger-full-access", "--b"]))
    assert snap["extra_args"] == ["--a", "--sandbox", "danger-full-access", "--b"]
    assert "danger-full-access" not in snap["native_args"]
    kept = [a for a in snap["native_args"] if a in ("--a", "--b")]
    assert kept == ["--a", "--b"]


async def test_runtime_admission_validates_platform_support_and_workspace_access(core):
    await core.registry.register(core.admin,
                                 p.Register(name="win", slots=1, capabilities={**CAPS, "platform": "windows"}))
    await core.registry.register(core.admin,
                                 p.Register(name="ro", slots=1, capabilities={**CAPS, "workspace_writable": False}))
    with pytest.raises(Invalid, match="windows"):
        await submit(core, profile="claude", runtime="win")
    with pytest.raises(Invalid, match="workspace"):
        await submit(core, profile="claude", runtime="ro")


async def reregister(hub, name: str, **caps) -> None:
    hub.settings.profiles.presets = {}  # no preset pins a runtime: these tasks name none
    await hub.registry.register(hub.admin, p.Register(name=name, slots=2, capabilities={**CAPS, **caps}))


async def test_a_task_naming_no_runtime_is_refused_when_only_unsupported_platforms_offer_its_engine(core):
    for name in ("gpu", "cpu"):
        await reregister(core, name, platform="windows")
    with pytest.raises(Invalid) as e:
        await submit(core, profile="codex")
    assert "cpu runs on windows, gpu runs on windows" in e.value.message and "linux or macOS" in e.value.message


async def test_admission_freezes_the_launch_platforms_and_the_door_that_admitted_the_task(core):
    core.settings.profiles.presets = {}
    snap = await snapshot_of(core, await submit(core, profile="codex"))
    assert snap["platforms"] == ["darwin", "linux"] and snap["origin"] == "submit"


async def test_placement_never_puts_a_task_naming_no_runtime_on_an_unsupported_platform_or_unwritable_workspace(core):
    await reregister(core, "gpu", platform="windows")
    await reregister(core, "cpu", workspace_writable=False, workspace_root="/ro")
    tid = await submit(core, profile="codex")
    assert await core.dispatcher.place_once() == 0
    view = await core.tasks.get(core.admin, tid)
    assert view["status"] == "queued" and view["runtime"] is None
    assert view["waiting_for"] == ("waiting for a runtime that offers engine codex on linux or macOS; none can take "
                                   "it: cpu cannot write its workspace root '/ro'; gpu runs on windows; this task "
                                   "launches on linux or macOS only")
    await reregister(core, "cpu")  # its operator fixed the workspace
    assert await core.dispatcher.place_once() == 1
    assert (await core.tasks.get(core.admin, tid))["runtime"] == "cpu"


async def test_a_model_override_the_runtime_cannot_serve_is_refused(core):
    await core.registry.register(core.admin, p.Register(name="pinned", slots=1,
                                                        capabilities={**CAPS, "fixed_models": {"claude": "m1"}}))
    with pytest.raises(Invalid, match="serves only model"):
        await submit(core, profile="claude", runtime="pinned", model="m2")
    assert await submit(core, profile="claude", runtime="pinned")


async def test_a_credential_profile_missing_a_variable_is_refused_before_launch(core):
    await core.credentials.declare(core.admin, "anthropic", ["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"])
    await core.credentials.set_value(core.admin, "anthropic", "ANTHROPIC_API_KEY", "sk-ant-secret-value-1")
    with pytest.raises(Invalid, match="ANTHROPIC_BASE_URL"):
        await submit(core, profile="claude", credential_profile="anthropic")
    await core.credentials.set_value(core.admin, "anthropic", "ANTHROPIC_BASE_URL", "https://proxy.example")
    snap = await snapshot_of(core, await submit(core, profile="claude", credential_profile="anthropic"))
    assert snap["credential_profile"] == {"name": "anthropic", "env": ["ANTHROPIC_API_KEY", "ANTHROPIC_BASE_URL"]}


async def test_only_declared_variables_of_the_effective_principal_are_materialized(core):
    await core.credentials.declare(core.admin, "openai", ["OPENAI_API_KEY"])
    bob = await core.auth.authenticate(await core.auth.create_token("bob"))
    await core.credentials.set_value(core.admin, "openai", "OPENAI_API_KEY", "sk-admin-only")
    await core.credentials.set_value(bob, "openai", "OPENAI_API_KEY", "sk-bob-only")
    # redeclared: the old name is no longer declared
    await core.credentials.declare(core.admin, "openai", ["OPENAI_ORG"])
    async with core.db.read() as conn:
        assert await core.credentials.materialize(conn, "openai", bob.principal_id) == {}
    await core.credentials.declare(core.admin, "openai", ["OPENAI_API_KEY"])
    async with core.db.read() as conn:
        assert await core.credentials.materialize(conn, "openai", bob.principal_id) == {"OPENAI_API_KEY": "sk-bob-only"}


async def test_credential_values_are_stored_only_encrypted(core):
    await core.credentials.declare(core.admin, "anthropic", ["ANTHROPIC_API_KEY"])
    await core.credentials.set_value(core.admin, "anthropic", "ANTHROPIC_API_KEY", "sk-ant-plaintext-xyz")
    async with core.db.read() as conn:
        dump = [str(tuple(r)) for t in metadata.sorted_tables for r in await conn.execute(sa.select(t))]
    assert not any("sk-ant-plaintext-xyz" in line for line in dump)


async def test_a_dispatch_carries_the_credentials_but_the_snapshot_does_not(core):
    await core.credentials.declare(core.admin, "anthropic", ["ANTHROPIC_API_KEY"])
    await core.credentials.set_value(core.admin, "anthropic", "ANTHROPIC_API_KEY", "sk-ant-in-transit")
    tid = await submit(core, profile="claude", runtime="cpu", credential_profile="anthropic")
    rt, conn_id, _ = await core.registry.register(core.admin, p.Register(name="cpu", slots=2, capabilities=CAPS))
    await core.dispatcher.place_once()
    out = await runner_outgoing(core.runner_dispatch, rt, conn_id, set())
    env = out[0]["env"]
    assert out[0]["task_id"] == tid and env.pop("ANTHROPIC_API_KEY") == "sk-ant-in-transit"
    assert set(env) == {"AMUX_HUB_URL", "AMUX_TOKEN"}  # plus the run's coordination variables, nothing else
    assert "sk-ant-in-transit" not in json.dumps(await snapshot_of(core, tid))


async def test_a_passing_engine_check_stands_for_two_seconds_and_a_refusal_is_never_remembered(core, clock):
    await submit(core, profile="codex")  # passes: both runtimes offer codex on linux
    for name in ("gpu", "cpu"):
        await reregister(core, name, platform="windows")
    await submit(core, profile="codex")  # within ENGINE_CHECK_S the passing check stands
    clock.advance(2.1)
    with pytest.raises(Invalid, match="cpu runs on windows"):
        await submit(core, profile="codex")  # read again once it lapsed
    await reregister(core, "gpu", platform="linux")
    await submit(core, profile="codex")  # the refusal was not remembered: the fixed runtime counts at once


async def test_freeze_many_answers_each_item_what_freeze_answers_resolving_shared_choices_once(core):
    """A batch gives each (caller, request) the snapshot or refusal `freeze` gives it alone, in order; a set of
    choices shared by several items is resolved once, and each snapshot is its own object."""
    await core.credentials.declare(core.admin, "anthropic", ["ANTHROPIC_API_KEY"])
    await core.credentials.set_value(core.admin, "anthropic", "ANTHROPIC_API_KEY", "sk-ant-secret-value-1")
    bob = await core.auth.authenticate(await core.auth.create_token("bob"))
    items = [(core.admin, SubmitRequest(prompt="say one", profile="scripted", name="a")),
             (core.admin, SubmitRequest(prompt="bogus line", profile="scripted")),       # the prompt: this item only
             (core.admin, SubmitRequest(prompt="say two", profile="scripted", name="b")),
             (core.admin, SubmitRequest(prompt="", profile="scripted")),                 # the shape: this item only
             (core.admin, SubmitRequest(prompt="say x", profile="nope")),                # unknown profile
             (core.admin, SubmitRequest(prompt="say x", profile="scripted", runtime="gpu", timeout_s=5)),
             (core.admin, SubmitRequest(prompt="review", profile="claude", credential_profile="anthropic")),
             (bob, SubmitRequest(prompt="review", profile="claude", credential_profile="anthropic")),  # bob lacks it
             (bob, SubmitRequest(prompt="say three", profile="scripted"))]
    gets = []
    real_get = core.profiles.get

    async def counting_get(conn, name):
        gets.append(name)
        return await real_get(conn, name)

    core.profiles.get = counting_get
    async with core.db.read() as conn:
        many = await core.admission.freeze_many(conn, items, origin="schedule")
        gets_many, gets[:] = list(gets), []
        alone = []
        for caller, req in items:
            try:
                alone.append(await core.admission.freeze(conn, caller, req, origin="schedule"))
            except Exception as e:
                alone.append(e)
    assert len(many) == len(items)
    for got, want in zip(many, alone):
        if isinstance(want, Exception):
            assert type(got) is type(want) and got.message == want.message
        else:
            assert got == want
    assert isinstance(many[1], Invalid) and "unknown command" in many[1].message
    assert isinstance(many[7], Invalid) and "ANTHROPIC_API_KEY" in many[7].message
    assert many[0] is not many[2] and many[0]["native_args"] is not many[2]["native_args"]
    # one profile lookup per distinct set of choices: (scripted), (nope), (scripted on gpu), (claude)
    assert sorted(gets_many) == ["claude", "nope", "scripted", "scripted"]
