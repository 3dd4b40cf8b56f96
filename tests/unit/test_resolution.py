"""Resolution rules, in the seed's order, one case each."""
from __future__ import annotations

import pytest

from hub.domain.resolution import Choices, Preset, ProfileView, SessionContext, resolve
from hub.errors import Invalid

CLAUDE = ProfileView("claude", "claude", builtin=True)
CODEX = ProfileView("codex", "codex", builtin=True)
REVIEWER = ProfileView("reviewer", "claude", builtin=False)
LOCKED = ProfileView("locked", "claude", builtin=False, allow_model_override=False)
PRESETS = {
    "claude": Preset(runtime="gpu-box", model="claude-sonnet-4-5", reasoning_effort="high"),
    "codex": Preset(runtime="codex-box"),
}
SESSION = SessionContext("claude", "claude-opus-4-1", "medium")


def test_an_explicit_runtime_and_model_win():
    r = resolve(CLAUDE, Choices(runtime="mine", model="x-model"), PRESETS, "claude", SESSION)
    assert (r.runtime, r.model) == ("mine", "x-model") and r.sources["model"] == "explicit"


def test_a_task_from_a_session_inherits_its_model_and_effort_on_the_same_engine():
    r = resolve(CLAUDE, Choices(), PRESETS, "claude", SESSION)
    assert (r.model, r.reasoning_effort) == ("claude-opus-4-1", "medium") and r.sources["model"] == "session"


def test_a_task_on_another_engine_does_not_inherit_the_sessions_model():
    r = resolve(CODEX, Choices(), PRESETS, "claude", SESSION)
    assert r.model is None and r.sources["model"] == "engine-default"


def test_inherited_choices_that_do_not_resolve_for_the_child_profile_keep_the_callers_resolution():
    r = resolve(LOCKED, Choices(), PRESETS, "claude", SESSION)
    assert r.model is None and r.runtime == "gpu-box" and r.sources["model"] == "engine-default"


def test_without_a_runtime_a_builtin_shortcut_uses_its_own_launch_preset():
    r = resolve(CODEX, Choices(), PRESETS, "claude")
    assert r.runtime == "codex-box" and r.preset == "codex"


def test_without_a_runtime_other_profiles_use_the_distribution_default_preset():
    r = resolve(REVIEWER, Choices(), PRESETS, "claude")
    assert (r.runtime, r.model, r.preset) == ("gpu-box", "claude-sonnet-4-5", "claude")


def test_an_omitted_model_uses_the_presets_model_when_its_runtime_is_inherited():
    assert resolve(CLAUDE, Choices(), PRESETS, "claude").model == "claude-sonnet-4-5"


def test_an_omitted_model_with_an_explicit_runtime_uses_the_engines_native_default():
    r = resolve(CLAUDE, Choices(runtime="mine"), PRESETS, "claude")
    assert r.model is None and r.sources["model"] == "engine-default"


def test_an_omitted_model_with_no_model_configured_uses_the_engines_native_default():
    assert resolve(CODEX, Choices(), PRESETS, "claude").model is None


def test_unlisted_model_names_pass_unchanged():
    assert resolve(CLAUDE, Choices(model="some-future-model@2031"), PRESETS, "claude").model == "some-future-model@2031"


def test_an_explicit_model_is_refused_when_the_profile_policy_forbids_overrides():
    with pytest.raises(Invalid, match="omit model"):
        resolve(LOCKED, Choices(model="x"), PRESETS, "claude")


def test_an_unknown_reasoning_effort_is_refused_with_the_choices():
    with pytest.raises(Invalid, match="high"):
        resolve(CLAUDE, Choices(reasoning_effort="max"), PRESETS, "claude")


def test_defaults_do_not_replace_explicit_effort():
    assert resolve(CLAUDE, Choices(reasoning_effort="low"), PRESETS, "claude").reasoning_effort == "low"


BUILTINS = ("claude", "codex", "pi", "scripted")
# The README's own example: only Claude has a preset; it is also the distribution default.
ONLY_CLAUDE = {"claude": Preset(runtime="gpu-box", model="claude-sonnet-4-5", reasoning_effort="high")}


@pytest.mark.parametrize("name", BUILTINS)
def test_a_builtin_with_a_preset_of_its_own_launches_with_that_preset(name):
    own = {**ONLY_CLAUDE, name: Preset(runtime=f"{name}-box", model=f"{name}-model", reasoning_effort="low")}
    r = resolve(ProfileView(name, name, builtin=True), Choices(), own, "claude")
    assert (r.runtime, r.model, r.reasoning_effort, r.preset) == (f"{name}-box", f"{name}-model", "low", name)
    assert r.sources == {"runtime": f"preset:{name}", "model": f"preset:{name}", "reasoning_effort": f"preset:{name}"}


@pytest.mark.parametrize("name", [b for b in BUILTINS if b != "claude"])
def test_a_builtin_without_a_preset_of_its_own_uses_its_engines_native_defaults_not_the_distribution_default(name):
    r = resolve(ProfileView(name, name, builtin=True), Choices(), ONLY_CLAUDE, "claude")
    assert (r.runtime, r.model, r.reasoning_effort, r.preset) == (None, None, None, None)
    assert r.sources == {"runtime": "engine-default", "model": "engine-default", "reasoning_effort": "engine-default"}


@pytest.mark.parametrize("name", BUILTINS)
def test_a_builtin_without_any_preset_uses_its_engines_native_defaults(name):
    r = resolve(ProfileView(name, name, builtin=True), Choices(), {}, "claude")
    assert (r.runtime, r.model, r.reasoning_effort, r.preset) == (None, None, None, None)


@pytest.mark.parametrize("name", [b for b in BUILTINS if b != "claude"])
def test_a_builtin_without_a_preset_of_its_own_still_inherits_a_sessions_choices_on_its_engine(name):
    r = resolve(ProfileView(name, name, builtin=True), Choices(), ONLY_CLAUDE, "claude",
                SessionContext(name, f"{name}-session-model", "medium"))
    assert (r.runtime, r.model, r.reasoning_effort) == (None, f"{name}-session-model", "medium")
    assert r.sources["model"] == "session"


def test_a_non_builtin_profile_on_another_engine_takes_the_default_presets_runtime_but_not_its_model_or_effort():
    r = resolve(ProfileView("coder", "codex", builtin=False), Choices(), ONLY_CLAUDE, "claude")
    assert (r.runtime, r.preset, r.sources["runtime"]) == ("gpu-box", "claude", "preset:claude")
    assert (r.model, r.reasoning_effort) == (None, None)
    assert r.sources["model"] == r.sources["reasoning_effort"] == "engine-default"
