"""Tools' output schemas are published compact (references inlined, nullable types as type lists) and accept and
refuse exactly what the schemas the SDK generated do."""
from __future__ import annotations

import copy
import json
import random
from typing import Any

from jsonschema.validators import validator_for
from pydantic import BaseModel
from referencing import Registry

from hub.mcp.server import AmuxMCPServer, compact_schema

VALUES: list[Any] = [None, "x", 1, 1.5, True, {}, [], {"a": "b"}, ["x"]]


class Inner(BaseModel):
    """A nested model."""

    text: str = ""
    size: int | None = None
    tags: list[str] | None = None


class Outer(BaseModel):
    """A model with nested, optional and mapped fields."""

    id: str
    inner: Inner | None = None
    items: list[Inner] = []
    limits: dict[str, str] | None = None
    flag: bool = False
    anything: Any = None


class Node(BaseModel):
    """A model that refers to itself."""

    children: list["Node"] = []


def validator(schema: dict[str, Any]) -> Any:
    return validator_for(schema)(schema, registry=Registry())


def instances(schema: dict[str, Any], n: int, seed: int = 7) -> list[Any]:
    """Valid-looking instances of `schema`, most of them with one value replaced by something of another type."""
    rng = random.Random(seed)

    def gen(s: dict[str, Any], depth: int = 0) -> Any:
        while "$ref" in s:
            s = {**schema["$defs"][s["$ref"].rsplit("/", 1)[1]], **{k: v for k, v in s.items() if k != "$ref"}}
        if "anyOf" in s:
            return gen(rng.choice(s["anyOf"]), depth)
        kind = s.get("type")
        if kind == "object" or "properties" in s:
            return {k: gen(sub, depth + 1) for k, sub in s.get("properties", {}).items()
                    if k in s.get("required", []) or rng.random() < 0.7}
        if kind == "array":
            return [gen(s.get("items", {}), depth + 1) for _ in range(rng.randint(0, 2))]
        return {"string": "s", "integer": 3, "boolean": False, "null": None}.get(kind, rng.choice(VALUES))

    def mutate(x: Any) -> Any:
        x = copy.deepcopy(x)
        paths: list[list[Any]] = []

        def walk(v: Any, p: list[Any]) -> None:
            paths.append(p)
            for k, e in (v.items() if isinstance(v, dict) else enumerate(v) if isinstance(v, list) else ()):
                walk(e, [*p, k])

        walk(x, [])
        p = rng.choice(paths)
        if not p:
            return rng.choice(VALUES)
        cur = x
        for k in p[:-1]:
            cur = cur[k]
        cur[p[-1]] = rng.choice(VALUES)
        return x

    return [mutate(gen(schema)) if rng.random() < 0.8 else gen(schema) for _ in range(n)]


def test_the_compact_schema_has_no_references_or_nullable_branches_and_judges_every_instance_alike():
    generated = Outer.model_json_schema()
    compact = compact_schema(generated)
    text = json.dumps(compact)
    assert "$ref" not in text and "$defs" not in text and "anyOf" not in text
    assert compact["properties"]["limits"]["type"] == ["object", "null"]
    before, after = validator(generated), validator(compact)
    verdicts = [(before.is_valid(i), after.is_valid(i)) for i in instances(generated, 3000)]
    assert all(b == a for b, a in verdicts)
    assert {b for b, _ in verdicts} == {True, False}  # both kinds were tried


def test_a_self_referring_schema_is_published_as_generated():
    generated = Node.model_json_schema()
    assert compact_schema(generated) == generated


def test_a_nullable_branch_with_keywords_for_other_types_stays_an_any_of():
    schema = {"anyOf": [{"type": "string", "minimum": 3}, {"type": "null"}]}
    assert compact_schema(schema) == schema


async def test_the_published_output_schema_is_the_compact_one_and_results_still_match_the_return_model():
    server = AmuxMCPServer("t")

    @server.tool()
    def outer(id: str) -> Outer:
        """Return an Outer."""
        return Outer(id=id)

    (tool,) = await server.list_tools()
    assert tool.output_schema == compact_schema(Outer.model_json_schema())
    result = await server.call_tool("outer", {"id": "x"})
    assert result.structured_content["id"] == "x"
    assert await server.list_tools() == [tool]  # built once, until the tools change
