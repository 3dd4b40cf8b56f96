"""Execution choices: the one definition of what a Task or a schedule's Task may choose, with its bounds.

REST bodies inherit these models, MCP tool signatures are generated from their fields (`hub/mcp/choices.py`),
admission validates every `SubmitRequest` (tasks, task_run, sessions, instances, schedule specs at create, update
and each fire) through `TaskChoices`, so the OpenAPI document, the MCP input schemas and the server's refusals
share one set of bounds. Semantic rules (a profile exists, a policy is known) stay in admission.
"""
from __future__ import annotations

from typing import Annotated, Any, ClassVar, Literal

from pydantic import AfterValidator, Field

from .shapes import Clearable, Model, Short, storable, validate

MAX_EXTRA_ARGS = 64          # arguments in `extra_args`
MAX_ARG_CHARS = 4096         # characters of one argument
MAX_TIMEOUT_S = 7 * 86400    # a Task's `timeout_s`

Args = Annotated[list[Annotated[str, Field(max_length=MAX_ARG_CHARS), AfterValidator(storable)]], Field(
    max_length=MAX_EXTRA_ARGS,
    description=f"extra engine arguments: at most {MAX_EXTRA_ARGS}, each of at most {MAX_ARG_CHARS} characters")]
Seconds = Annotated[float, Field(gt=0, le=MAX_TIMEOUT_S, description=f"seconds, at most {MAX_TIMEOUT_S}, e.g. 600")]
Isolation = Literal["linux-dac", "userns", "process"]


class ExecutionChoices(Model):
    """What a Task (or each Task of a subtask schedule) may choose; omitted (None) choices are resolved at
    admission."""

    hint: ClassVar[str] = 'omit a choice to have it resolved at admission, e.g. {"profile": "scripted"}'
    what: ClassVar[str] = "the execution choices"
    profile: Short | None = None
    runtime: Short | None = None
    model: Short | None = None
    reasoning_effort: Short | None = None
    extra_args: Args | None = None
    permission_policy: Short | None = None
    credential_profile: Short | None = None
    timeout_s: Seconds | None = None


class LimitChoices(Model):
    """Resource limits a Task asks for: each may only lower the runner's (and the profile's); omitted: theirs."""

    hint: ClassVar[str] = 'e.g. {"memory_max": "2GiB", "pids_max": 256, "cpu_max": 1.5}'
    what: ClassVar[str] = "limits"
    memory_max: Annotated[str, Field(max_length=32, description='bytes with a unit, e.g. "2GiB" or "512MiB"')] | \
        Annotated[int, Field(ge=16 << 20, description="bytes")] | None = None
    pids_max: Annotated[int, Field(ge=1, le=4_194_304, description="processes and threads, e.g. 256")] | None = None
    cpu_max: Annotated[float, Field(ge=0.01, le=4096, description="cores, e.g. 1.5")] | None = None


class TaskChoices(ExecutionChoices):
    """A Task's choices: a schedule's plus the isolation mode (omitted: the strongest an eligible runtime offers)
    and resource limits (omitted: the profile's, else the runner's)."""

    isolation: Isolation | None = None
    limits: LimitChoices | None = None


class ChoiceChanges(ExecutionChoices):
    """The choices of a schedule update: omitted ones are kept, and "" clears one back to the default."""

    profile: Clearable | None = None
    runtime: Clearable | None = None
    model: Clearable | None = None
    reasoning_effort: Clearable | None = None
    permission_policy: Clearable | None = None
    credential_profile: Clearable | None = None


CHOICES: tuple[str, ...] = tuple(ExecutionChoices.model_fields)
TASK_CHOICES: tuple[str, ...] = tuple(TaskChoices.model_fields)


def check_task_choices(source: Any) -> TaskChoices:
    """Validate the Task choices held by `source` (any object with those attributes), raising Invalid naming the
    field and its bound."""
    return validate(TaskChoices, {k: getattr(source, k) for k in TASK_CHOICES if getattr(source, k) is not None},
                    "body")
