"""The building blocks of every typed shape a door accepts: bounded, storable text, and the strict base model whose
refusals name the field and the fix (REST bodies, MCP arguments and admission all refuse through it)."""
from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, ValidationInfo
from pydantic_core import PydanticCustomError

from ..errors import Invalid
from .text import BadText, check_text


def storable(value: str, info: ValidationInfo) -> str:
    """Refuse text no store can keep (NUL bytes, unpaired surrogates), naming the field."""
    try:
        check_text(value, f"`{info.field_name}`" if info.field_name else "a field")
    except BadText as e:
        raise PydanticCustomError("bad_text", "{reason}", {"reason": str(e)}) from None
    return value


def text(max_length: int, min_length: int = 0, pattern: str | None = None, description: str = "") -> Any:
    """A string every store can keep, of bounded length (and, optionally, a shape)."""
    return Annotated[str, Field(min_length=min_length, max_length=max_length, pattern=pattern,
                                description=description or None), AfterValidator(storable)]


Short = text(200, 1, description="1 to 200 characters")
Clearable = text(200, description='1 to 200 characters, or "" to clear it back to the default resolved at each fire')


class Model(BaseModel):
    """A request part: unknown keys refused, strict JSON types; `hint` is the fix shown with a refusal."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    hint: ClassVar[str] = ""
    what: ClassVar[str] = "this request"


def refusal_message(model: type[Model], err: ValidationError, part: str) -> str:
    """Say which field is wrong and how to mend it (all unknown keys at once)."""
    errors = err.errors(include_url=False)
    unknown = sorted(str(e["loc"][-1]) for e in errors if e["type"] == "extra_forbidden")
    noun = "query parameters" if part == "query" else "fields"
    if unknown:
        return f"unknown {noun} {unknown}; {model.what} takes {sorted(model.model_fields)}"
    e = errors[0]
    name = ".".join(str(x) for x in e["loc"]) or part
    label = {"query": f"query parameter {name}", "path": f"path parameter {name}"}.get(part, name)
    if e["type"] == "bad_text":
        return str(e["msg"]) if part == "body" else str(e["msg"]).replace(f"`{e['loc'][0]}`", label, 1)
    if e["type"] == "missing":
        return f"{label} is required; {model.hint}".rstrip("; ")
    desc = _description(model, str(e["loc"][0])) if e["loc"] else ""
    fix = f"it must be {desc}" if desc else model.hint
    return f"{label} {_lower(e['msg'])}; {fix}".rstrip("; ")


def _lower(msg: str) -> str:
    """Pydantic's "Input should be …" reads as "<field> should be …"."""
    for lead in ("Input ", "String ", "Value ", "List "):
        if msg.startswith(lead + "should"):
            return msg[len(lead):]
    return msg[:1].lower() + msg[1:]


def _description(model: type[Model], name: str) -> str:
    info = model.model_fields.get(name)
    if info is None:
        return ""
    if info.description:
        return info.description
    for meta in info.metadata:
        description = getattr(meta, "description", None)
        if isinstance(description, str) and description:
            return description
    return ""


def validate(model: type[Model], data: Any, part: str) -> Any:
    """Validate one request part, raising Invalid that names the field and the fix."""
    try:
        return model.model_validate(data)
    except ValidationError as e:
        raise Invalid(refusal_message(model, e, part)) from None
