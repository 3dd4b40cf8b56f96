"""Every door is as strict as REST: an argument a tool does not take is refused, naming it, and nothing is stored."""
from __future__ import annotations

import itertools
from typing import Any

import httpx2
import pytest

from bot.cards.actions import CardAction, UnknownKey
from hub.errors import Invalid
from hub.web import api_models as m
from tests.helpers import mcp_client
from tests.integration.test_feishu_bot import Bot, bot  # noqa: F401 — the Feishu webhook client and its fixture

UNKNOWN = "permision_policy"  # a misspelt key: a lax door would drop it and apply policy-allow


def dummy(schema: dict[str, Any]) -> Any:
    """Return a plausible value of a JSON schema (the first choice of an enum, else one of its type)."""
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    kinds = schema.get("type") or [b.get("type") for b in schema.get("anyOf", []) if isinstance(b, dict)]
    kind = next((k for k in ([kinds] if isinstance(kinds, str) else kinds) if k and k != "null"), "string")
    return {"string": "x", "integer": 1, "number": 1, "boolean": False, "array": [], "object": {}}[kind]


async def stored_tasks(hub) -> list[dict]:
    async with httpx2.AsyncClient(timeout=10) as http:
        resp = await http.get(f"{hub.url}/api/v1/tasks", headers={"Authorization": f"Bearer {hub.admin_token}"})
    assert resp.status_code == 200, resp.text
    return resp.json()["tasks"]


@pytest.mark.parametrize("mode", ["auto", "legacy"])  # the 2026 protocol and the handshake one
async def test_every_mcp_tool_refuses_an_unknown_argument_naming_it_and_publishes_a_closed_schema(hub, mode):
    async with mcp_client(hub.url, hub.admin_token, mode=mode) as c:
        tools = (await c.list_tools()).tools
        assert len(tools) > 30, [t.name for t in tools]
        for tool in tools:
            schema = tool.input_schema
            assert schema.get("additionalProperties") is False, (tool.name, schema)
            props = schema.get("properties") or {}
            args = {name: dummy(props[name]) for name in schema.get("required", [])}
            res = await c.call_tool(tool.name, {**args, UNKNOWN: "deny-all"})
            text = res.content[0].text if res.content else ""
            assert res.is_error, (tool.name, res.structured_content)
            assert f"{tool.name} has no argument '{UNKNOWN}'" in text and "takes" in text, (tool.name, text)
    assert await stored_tasks(hub) == []


async def test_a_misspelt_permission_policy_on_task_submit_stores_no_task_and_names_the_right_one(hub):
    await hub.start_runner()
    async with mcp_client(hub.url, hub.admin_token) as c:
        res = await c.call_tool("task_submit", {"prompt": "say hi", "profile": "scripted", UNKNOWN: "deny-all"})
        assert res.is_error
        text = res.content[0].text
        assert text.startswith("task_submit has no argument 'permision_policy'; did you mean 'permission_policy'? "
                               "It takes: prompt, "), text
        assert await stored_tasks(hub) == []
        several = await c.call_tool("task_submit", {"prompt": "say hi", "colour": "red", "profil": "scripted"})
        assert several.is_error and "no arguments 'colour', 'profil' (did you mean 'profile'?)" in \
            several.content[0].text, several.content
        ok = await c.call_tool("task_submit", {"prompt": "say hi", "profile": "scripted",
                                               "permission_policy": "deny-all"})
        assert not ok.is_error, ok.content
    assert [t["task_id"] for t in await stored_tasks(hub)] == [ok.structured_content["task_id"]]


async def test_a_card_action_with_an_unknown_key_is_refused_with_a_toast_naming_it_and_nothing_changes(bot: Bot):
    await bot.overview_card("ou_alice")
    alice = await bot.principal("ou_alice")
    sid = await bot.schedule(alice, "nightly build")
    status, res = await bot.press("ou_alice", {"p": "amux", "v": 1, "op": "pause", "s": sid, "force": 1})
    assert status == 200 and res["toast"]["type"] == "warning" and "card" not in res, res
    assert "'force'" in res["toast"]["content"] and "nothing was changed" in res["toast"]["content"]
    assert "'force'" in res["toast"]["i18n"]["zh_cn"] and "没有做任何更改" in res["toast"]["i18n"]["zh_cn"]
    assert (await bot.hub.schedules.get(alice, sid))["paused"] is False
    with pytest.raises(UnknownKey, match="'force'"):
        CardAction.unpack({"p": "amux", "v": 1, "op": "pause", "s": sid, "force": 1})
    assert CardAction.unpack(CardAction.of("pause", schedule_id=sid).pack()).op == "pause"


def path_values(model: type | None) -> dict[str, str]:
    """Return path parameters the route's model accepts (its first choice, else the first plausible identifier)."""
    if model is None:
        return {}
    props = model.model_json_schema().get("properties", {})
    choices = {name: [*(p.get("enum") or []), "x1", "X1", "cli_x1", "ou_x1", "k1"] for name, p in props.items()}
    for combo in itertools.product(*choices.values()):
        values = dict(zip(choices, combo))
        try:
            m.validate(model, values, "path")
        except Invalid:
            continue
        return values
    raise AssertionError(f"no plausible path for {model.__name__}")


async def test_every_rest_operation_refuses_an_unknown_query_parameter_and_body_field_naming_it(hub):
    headers = {"Authorization": f"Bearer {hub.admin_token}", "Content-Type": "application/json"}
    assert len(m.OPS) > 40 and sum(1 for o in m.OPS if o.body) > 10
    async with httpx2.AsyncClient(timeout=10, headers=headers) as http:
        for o in m.OPS:
            url = hub.url + o.path.format(**path_values(o.path_model))
            resp = await http.request(o.method, url, params={UNKNOWN: "deny-all"}, content=b"{}")
            assert resp.status_code == 400, (o.id, resp.status_code, resp.text[:300])
            assert f"unknown query parameters ['{UNKNOWN}']" in resp.json()["fix"], (o.id, resp.text[:300])
            if o.body is not None:
                resp = await http.request(o.method, url, json={UNKNOWN: "deny-all"})
                assert resp.status_code == 400, (o.id, resp.status_code, resp.text[:300])
                assert f"unknown fields ['{UNKNOWN}']" in resp.json()["fix"], (o.id, resp.text[:300])
    assert await stored_tasks(hub) == []
