"""One execution-choices model (hub/domain/choices.py): the OpenAPI document, the MCP input schemas and the server's
refusals carry the same bounds, on REST and over the official MCP client."""
from __future__ import annotations

from typing import Any

import httpx2
import pytest

from hub.domain.choices import (MAX_ARG_CHARS, MAX_EXTRA_ARGS, MAX_TIMEOUT_S, TASK_CHOICES, ChoiceChanges,
                                ExecutionChoices, TaskChoices)
from hub.errors import Invalid
from hub.services.tasks.admission import SubmitRequest
from hub.services.schedules.service import ScheduleSpec
from tests.helpers import mcp_client


def branch(prop: dict[str, Any]) -> dict[str, Any]:
    """The non-null branch of an optional property (generated `anyOf` or compact `type: [T, "null"]`)."""
    for b in prop.get("anyOf", []):
        if b.get("type") != "null":
            return b
    return prop


def bounds(prop: dict[str, Any]) -> dict[str, Any]:
    """The keywords that bound a value (what a door refuses beyond)."""
    b = branch(prop)
    keys = ("maxItems", "minLength", "maxLength", "maximum", "exclusiveMinimum", "enum", "pattern")
    out = {k: b[k] for k in keys if k in b}
    if "items" in b:
        out["items"] = bounds(b["items"])
    return out


def model_bounds(model: type) -> dict[str, dict[str, Any]]:
    props = model.model_json_schema()["properties"]  # type: ignore[attr-defined]
    return {name: bounds(props[name]) for name in model.model_fields}  # type: ignore[attr-defined]


def test_every_definition_of_a_task_or_schedule_takes_the_models_choices():
    assert set(TASK_CHOICES) <= set(SubmitRequest.__dataclass_fields__)
    assert set(ExecutionChoices.model_fields) <= set(ScheduleSpec.__dataclass_fields__)
    assert model_bounds(TaskChoices)["extra_args"] == {"maxItems": MAX_EXTRA_ARGS,
                                                       "items": {"maxLength": MAX_ARG_CHARS}}
    assert model_bounds(TaskChoices)["timeout_s"] == {"exclusiveMinimum": 0, "maximum": MAX_TIMEOUT_S}


async def test_the_openapi_documents_and_the_mcp_schemas_bounds_equal_the_execution_choices_models(hub):
    async with httpx2.AsyncClient(timeout=10) as http:
        spec = (await http.get(f"{hub.url}/api/v1/openapi.json")).json()
    comps = spec["components"]["schemas"]

    def body_of(op_id: str) -> dict[str, Any]:
        op = next(o for path in spec["paths"].values() for o in path.values() if o.get("operationId") == op_id)
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        return comps[schema["$ref"].rsplit("/", 1)[-1]] if "$ref" in schema else schema

    doors = {"task_submit": TaskChoices, "schedule_create": ExecutionChoices, "schedule_update": ChoiceChanges}
    for op_id, model in doors.items():
        props = body_of(op_id)["properties"]
        assert {k: bounds(props[k]) for k in model.model_fields} == model_bounds(model), op_id
    async with mcp_client(hub.url, hub.admin_token) as c:
        tools = {t.name: t for t in (await c.list_tools()).tools}
    for name, model in {**doors, "task_run": TaskChoices}.items():
        props = tools[name].input_schema["properties"]
        assert {k: bounds(props[k]) for k in model.model_fields} == model_bounds(model), name


@pytest.mark.parametrize("field, too_far", [
    ("extra_args", ["--x"] * (MAX_EXTRA_ARGS + 1)),
    ("extra_args", ["x" * (MAX_ARG_CHARS + 1)]),
    ("timeout_s", MAX_TIMEOUT_S + 1),
])
async def test_the_server_refuses_choices_beyond_the_models_bounds_on_rest_and_mcp_and_stores_nothing(
        hub, field, too_far):
    await hub.start_runner()
    body = {"prompt": "say hi", "profile": "scripted", field: too_far}
    headers = {"Authorization": f"Bearer {hub.admin_token}"}
    async with httpx2.AsyncClient(timeout=10) as http:
        resp = await http.post(f"{hub.url}/api/v1/tasks", json=body, headers=headers)
        assert resp.status_code == 400 and resp.json()["fix"].startswith(field), resp.text
        async with mcp_client(hub.url, hub.admin_token) as c:
            for tool in ("task_submit", "schedule_create"):
                args = {**body, "rule": "every 1h"} if tool == "schedule_create" else body
                res = await c.call_tool(tool, args)
                assert res.is_error and field in res.content[0].text, (tool, res.content)
        admin = await hub.hub.auth.authenticate(f"Bearer {hub.admin_token}")
        with pytest.raises(Invalid, match=field):  # the service door: admission checks the same model
            await hub.hub.tasks.submit(admin, SubmitRequest(**body))
        tasks = (await http.get(f"{hub.url}/api/v1/tasks", headers=headers)).json()["tasks"]
        schedules = (await http.get(f"{hub.url}/api/v1/schedules", headers=headers)).json()["schedules"]
    assert tasks == [] and schedules == []


async def test_choices_at_the_models_bounds_are_admitted_on_rest_and_mcp(hub):
    await hub.start_runner()
    body = {"prompt": "say hi", "profile": "scripted", "extra_args": ["--x"] * MAX_EXTRA_ARGS,
            "timeout_s": MAX_TIMEOUT_S}
    async with httpx2.AsyncClient(timeout=10) as http:
        resp = await http.post(f"{hub.url}/api/v1/tasks", json=body,
                               headers={"Authorization": f"Bearer {hub.admin_token}"})
    assert resp.status_code == 201, resp.text
    async with mcp_client(hub.url, hub.admin_token) as c:
        res = await c.call_tool("task_submit", body)
    assert not res.is_error, res.content
