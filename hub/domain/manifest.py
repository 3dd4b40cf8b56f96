"""Profile manifests: version 2 only."""
from __future__ import annotations

import hashlib
import json
import tomllib
from typing import Literal

from pydantic import BaseModel, Field, ValidationError, field_validator

from ..errors import Invalid
from .limits import parse_size
from .policy import POLICIES, PolicyName

ENGINES = ("claude", "codex", "pi", "scripted")
UPGRADE_HINT = ("set manifest_version = 2; launch choices (model, runtime, effort) no longer belong in a profile — "
                "pass them with the task or configure a launch preset")


class Expert(BaseModel):
    """Expert content the profile brings to a launch."""

    instructions: str = Field(default="", max_length=64 * 1024)
    authoring: Literal["none", "local"] = "none"


class ProfilePolicy(BaseModel):
    """What explicit overrides the profile allows."""

    allow_model_override: bool = True
    permission_policies: list[PolicyName] = Field(default_factory=lambda: list(POLICIES))


class ProfileLimits(BaseModel):
    """A profile's resource limits (hub.domain.limits): each may only lower the runner's."""

    model_config = {"extra": "forbid"}

    memory_max: str | int | None = None
    pids_max: int | None = Field(default=None, ge=1, le=4_194_304)
    cpu_max: float | None = Field(default=None, ge=0.01, le=4096)

    @field_validator("memory_max")
    @classmethod
    def _size(cls, v: str | int | None) -> str | int | None:
        if v is not None:
            try:
                parse_size(v, "limits.memory_max")
            except Invalid as e:
                raise ValueError(e.message) from None
        return v


class ManifestV2(BaseModel):
    """A v2 profile manifest."""

    model_config = {"extra": "forbid"}

    manifest_version: Literal[2]
    name: str = Field(pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")
    engine: Literal["claude", "codex", "pi", "scripted"]
    description: str = Field(default="", max_length=500)
    expert: Expert = Field(default_factory=Expert)
    policy: ProfilePolicy = Field(default_factory=ProfilePolicy)
    credential_profile: str | None = None
    # Resource limits the profile's runs get, below the runner's (e.g. {"memory_max": "2GiB", "pids_max": 256});
    # a task request may lower them further, nobody may raise them past the runner's.
    limits: ProfileLimits | None = None

    def digest(self) -> str:
        """Return the content digest frozen into snapshots (a manifest without limits digests as it did before)."""
        body = json.dumps(self.model_dump(exclude={"limits"} if self.limits is None else None),
                          sort_keys=True).encode()
        return "sha256:" + hashlib.sha256(body).hexdigest()[:32]


def parse_manifest(text: str) -> ManifestV2:
    """Parse a JSON or TOML manifest; refuse anything but version 2 with what to change."""
    data = None
    try:
        data = json.loads(text)
    except ValueError:
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as e:
            raise Invalid(f"profile manifest is neither JSON nor TOML ({e}); fix the syntax") from e
    if not isinstance(data, dict):
        raise Invalid("profile manifest must be a table/object")
    version = data.get("manifest_version")
    if version is None:
        raise Invalid(f"profile manifest has no manifest_version (an unversioned, v1-style manifest); {UPGRADE_HINT}")
    if version != 2:
        raise Invalid(f"profile manifest version {version!r} is not supported, only version 2; {UPGRADE_HINT}")
    try:
        return ManifestV2.model_validate(data)
    except ValidationError as e:
        err = e.errors()[0]
        where = ".".join(str(x) for x in err["loc"])
        raise Invalid(f"profile manifest field {where}: {err['msg']}; engines are {', '.join(ENGINES)}") from e
