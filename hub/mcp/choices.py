"""MCP tool signatures that take a shape's fields as arguments, generated from the shape's model.

A tool declared `@takes(TaskChoices)` receives each of the model's fields as a keyword argument of the model's own
type (its bounds and description), so its published input schema and the SDK's validation of the call carry the
same bounds as the REST body and admission (hub/domain/choices.py).
"""
from __future__ import annotations

import inspect
from typing import Annotated, Any, Callable, TypeVar, get_type_hints

from pydantic import BaseModel, Field

F = TypeVar("F", bound=Callable[..., Any])


def fields_as_parameters(model: type[BaseModel]) -> list[inspect.Parameter]:
    """Return the keyword-only parameters (default None) of `model`'s fields, each with its annotated type."""
    hints = get_type_hints(model, include_extras=True)
    return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None,
                              annotation=Annotated[hints[name], Field(description=info.description)]
                              if info.description else hints[name])
            for name, info in model.model_fields.items()]


def takes(model: type[BaseModel]) -> Callable[[F], F]:
    """Give a tool function whose last parameter is `**choices` the fields of `model` in its place (the SDK reads
    the signature); the function receives them in `choices`."""

    def decorate(fn: F) -> F:
        sig = inspect.signature(fn)
        params = [p for p in sig.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
        if len(params) == len(sig.parameters):
            raise TypeError(f"{fn.__name__} must end with **choices to take the fields of {model.__name__}")
        hints = get_type_hints(fn, include_extras=True)
        params = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in params]
        taken = {p.name for p in params}
        extra = [p for p in fields_as_parameters(model) if p.name not in taken]
        fn.__signature__ = sig.replace(parameters=[*params, *extra],  # type: ignore[attr-defined]
                                       return_annotation=hints.get("return", sig.return_annotation))
        return fn

    return decorate
