"""OpenAPI 3.1 for `/api/v1`, built from the route table and the typed models of api_models.py (no second copy).

`GET /api/v1/openapi.json` serves the spec and `GET /api/v1/docs` renders it as one self-contained HTML page
(no scripts, no CDN); neither needs a token.
"""
from __future__ import annotations

import html
import json
import re
from functools import lru_cache
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel

from . import api_models as m

SPEC_PATH = "/api/v1/openapi.json"
DOCS_PATH = "/api/v1/docs"
REF = "#/components/schemas/{model}"
STATUS_TEXT = {
    200: "OK", 201: "Created",
    400: "Invalid input: the error names the field and the fix",
    401: "No valid token: pass `Authorization: Bearer <token>` (`amux token create`)",
    403: "The token does not allow this (an admin token, or a task-run/runner token used outside its scope)",
    404: "No such thing visible to this token (or no such operation)",
    409: "The thing is in a state that does not allow this",
    413: "The request body is too large",
    429: "A per-principal limit is reached: the fix names the limit and its setting",
    500: "The hub failed unexpectedly: retry, and give the operator the request id",
}
ERROR_SCHEMA = {
    "type": "object",
    "description": "Every refusal: a code, what to do, and the request id the hub logged it under.",
    "required": ["error", "fix", "request_id"],
    "properties": {
        "error": {"type": "string", "description": "a short code: invalid, unauthorized, forbidden, not_found, "
                                                    "conflict, too_large, limit_reached, internal"},
        "fix": {"type": "string", "description": "what was wrong and how to mend it"},
        "message": {"type": "string", "description": "the same text as fix (older clients read it)"},
        "request_id": {"type": "string"},
    },
}


class _Schemas:
    """Collect model schemas into components, returning `$ref`s."""

    def __init__(self) -> None:
        self.components: dict[str, Any] = {"Error": ERROR_SCHEMA}

    def ref(self, model: type[BaseModel]) -> dict[str, Any]:
        """Return a `$ref` to `model`, adding it (and its definitions) to the components."""
        schema = self.inline(model)
        self.components[model.__name__] = schema
        return {"$ref": REF.format(model=model.__name__)}

    def inline(self, model: type[BaseModel]) -> dict[str, Any]:
        """Return `model`'s JSON schema, its nested definitions moved into the components (an answer's as it is
        serialized, a request's as it is validated)."""
        mode: Literal["validation", "serialization"] = "validation" if issubclass(model, m.Model) else "serialization"
        schema = model.model_json_schema(ref_template=REF, mode=mode)
        self.components.update(schema.pop("$defs", {}))
        return schema


def _no_null(schema: dict[str, Any]) -> dict[str, Any]:
    """A query parameter is omitted, never null: drop the null branch of `X | None`."""
    branches = [s for s in schema.get("anyOf", []) if s.get("type") != "null"]
    if len(branches) == 1:
        rest = {k: v for k, v in schema.items() if k != "anyOf"}
        return {**branches[0], **rest}
    return schema


def _parameters(schemas: _Schemas, model: type[m.Model] | None, where: str) -> list[dict[str, Any]]:
    if model is None:
        return []
    schema = schemas.inline(model)
    required = set(schema.get("required", []))
    out = []
    for name, prop in schema.get("properties", {}).items():
        prop = _no_null(dict(prop))
        prop.pop("title", None)
        param = {"name": name, "in": where, "required": where == "path" or name in required, "schema": prop}
        if prop.get("description"):
            param["description"] = prop["description"]
        out.append(param)
    return out


def _operation(schemas: _Schemas, o: m.Op) -> dict[str, Any]:
    op: dict[str, Any] = {"operationId": o.id, "summary": o.summary, "tags": [o.tag]}
    if o.admin:
        op["description"] = f"Administrators only: {o.admin}"
    params = _parameters(schemas, o.path_model, "path") + _parameters(schemas, o.query, "query")
    if params:
        op["parameters"] = params
    if o.body is not None:
        op["requestBody"] = {"required": True, "description": f"at most {o.max_body} bytes",
                             "content": {"application/json": {"schema": schemas.ref(o.body)}}}
    elif o.text_body:
        op["requestBody"] = {"required": True, "content": {"text/plain": {"schema": {
            "type": "string", "maxLength": o.max_body, "description": "a v2 profile manifest (TOML)"}}}}
    responses: dict[str, Any] = {}
    reply = schemas.ref(o.reply) if o.reply is not None else {"type": "object"}
    for status in o.ok:
        responses[str(status)] = {"description": STATUS_TEXT[status], "content": {"application/json": {
            "schema": reply if status == o.ok[0] else {"type": "object"}}}}
    for status in m.ERRORS:
        responses[str(status)] = {"description": STATUS_TEXT[status], "content": {"application/json": {
            "schema": {"$ref": REF.format(model="Error")}}}}
    op["responses"] = responses
    return op


@lru_cache(maxsize=1)
def build_spec() -> dict[str, Any]:
    """Build the OpenAPI 3.1 document of every `/api/v1` operation in the route table."""
    schemas = _Schemas()
    paths: dict[str, dict[str, Any]] = {}
    for o in m.OPS:
        paths.setdefault(o.path, {})[o.method.lower()] = _operation(schemas, o)
    return {
        "openapi": "3.1.0",
        "info": {"title": "amux hub REST API", "version": "1",
                 "description": "JSON REST for the CLI and pages. Every refusal is JSON "
                                "{\"error\", \"fix\", \"request_id\"}; the fix names what to do."},
        "servers": [{"url": "/"}],
        "security": [{"bearer": []}],
        "paths": paths,
        "components": {"schemas": schemas.components,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer",
                                                      "description": "an amux token (`amux token create`)"}}},
    }


def path_matches(template: str, path: str) -> bool:
    """Whether a concrete `/api/v1/...` path is an instance of a spec path template."""
    pattern = "^" + re.sub(r"\\\{[^}]+\\\}", "[^/]+", re.escape(template)) + "$"
    return re.match(pattern, path) is not None


def _schema_text(schema: dict[str, Any]) -> str:
    if "$ref" in schema:
        return schema["$ref"].rsplit("/", 1)[-1]
    if "anyOf" in schema:
        return " | ".join(_schema_text(s) for s in schema["anyOf"])
    kind = schema.get("type", "any")
    if kind == "array":
        kind = f"list of {_schema_text(schema.get('items', {}))}"
    bits = [str(kind)]
    if "enum" in schema:
        bits = [" | ".join(json.dumps(v) for v in schema["enum"])]
    if "const" in schema:
        bits = [json.dumps(schema["const"])]
    for key, label in (("minLength", "min"), ("maxLength", "max"), ("minimum", "≥"), ("maximum", "≤"),
                       ("exclusiveMinimum", ">"), ("pattern", "pattern")):
        if key in schema:
            bits.append(f"{label} {schema[key]}")
    return ", ".join(bits)


def _described(schema: dict[str, Any]) -> str:
    branches = (b["description"] for b in schema.get("anyOf", []) if "description" in b)
    return schema.get("description") or next(branches, "")


def _fields_table(schema: dict[str, Any]) -> str:
    required = set(schema.get("required", []))
    rows = "".join(f"<tr><td><code>{html.escape(k)}</code>{' *' if k in required else ''}</td>"
                   f"<td>{html.escape(_schema_text(v))}</td><td>{html.escape(_described(v))}</td></tr>"
                   for k, v in schema.get("properties", {}).items())
    return f"<table><tr><th>field</th><th>type</th><th></th></tr>{rows}</table>" if rows else ""


def render_docs(spec: dict[str, Any]) -> str:
    """Render the spec as one HTML page: each operation with its parameters, body fields and answers."""
    comps = spec["components"]["schemas"]
    parts = [f"<h1>{html.escape(spec['info']['title'])}</h1><p>{html.escape(spec['info']['description'])}</p>",
             f"<p>Machine-readable: <a href='{SPEC_PATH}'>{SPEC_PATH}</a> (OpenAPI {spec['openapi']}). "
             "Authenticate with <code>Authorization: Bearer &lt;token&gt;</code>.</p>", "<ul>"]
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            parts.append(f"<li><a href='#{op['operationId']}'><code>{method.upper()} {html.escape(path)}</code></a> "
                         f"— {html.escape(op['summary'])}</li>")
    parts.append("</ul>")
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            parts.append(f"<section id='{op['operationId']}'><h2><code>{method.upper()} {html.escape(path)}</code></h2>"
                         f"<p>{html.escape(op['summary'])}. {html.escape(op.get('description', ''))}</p>")
            params = op.get("parameters", [])
            if params:
                rows = "".join(f"<tr><td><code>{html.escape(p['name'])}</code></td><td>{p['in']}</td>"
                               f"<td>{html.escape(_schema_text(p['schema']))}</td></tr>" for p in params)
                parts.append(f"<h3>parameters</h3><table><tr><th>name</th><th>in</th><th>type</th></tr>{rows}</table>")
            body = op.get("requestBody", {}).get("content", {})
            for ctype, media in body.items():
                schema = media["schema"]
                if "$ref" in schema:
                    schema = comps[schema["$ref"].rsplit("/", 1)[-1]]
                parts.append(f"<h3>body ({html.escape(ctype)})</h3>"
                             + (_fields_table(schema) or f"<p>{html.escape(_schema_text(schema))}</p>"))
            answers = "".join(f"<tr><td>{code}</td><td>{html.escape(r['description'])}</td></tr>"
                              for code, r in op["responses"].items())
            parts.append(f"<h3>answers</h3><table>{answers}</table></section>")
    parts.append(f"<section><h2>Error</h2>{_fields_table(comps['Error'])}</section>")
    style = ("body{font:14px/1.45 system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem}"
             "table{border-collapse:collapse;margin:.3rem 0}td,th{border:1px solid #ccc;padding:.2rem .5rem;"
             "text-align:left;vertical-align:top}section{border-top:1px solid #ddd;margin-top:1rem}"
             "code{font-size:13px}")
    return (f"<!doctype html><html><head><meta charset='utf-8'><title>amux hub API</title><style>{style}</style>"
            f"</head><body>{''.join(parts)}</body></html>")


def add_routes(app: web.Application) -> None:
    """Serve the spec and its page (public: they describe the API, they do not use it)."""

    async def spec(_: web.Request) -> web.Response:
        return web.json_response(build_spec())

    async def docs(_: web.Request) -> web.Response:
        return web.Response(text=render_docs(build_spec()), content_type="text/html")

    app.router.add_get(SPEC_PATH, spec)
    app.router.add_get(DOCS_PATH, docs)
