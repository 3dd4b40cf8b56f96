"""The OpenAPI contract of `/api/v1`: served and rendered without a token, complete against the router and the CLI,
and fuzzed with schemathesis against a live hub on both stores (zero 5xx, zero answers outside the schema).

`make fuzz` runs the same fuzzing longer (AMUX_FUZZ_EXAMPLES, AMUX_FUZZ_SEED).
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import sys
from pathlib import Path

import httpx2
import pytest

from hub.errors import Invalid
from hub.web import api_models as m
from hub.web.api_models import OPS
from hub.web.openapi import build_spec, path_matches

ROOT = Path(__file__).resolve().parents[2]
CHECKS = "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance"


async def test_the_spec_and_its_page_are_served_without_a_token(hub):
    async with httpx2.AsyncClient(timeout=10) as http:
        spec = await http.get(f"{hub.url}/api/v1/openapi.json")
        page = await http.get(f"{hub.url}/api/v1/docs")
        unknown = await http.get(f"{hub.url}/api/v1/nope", headers={"Authorization": f"Bearer {hub.admin_token}"})
    assert spec.status_code == 200 and spec.json()["openapi"].startswith("3.1")
    assert spec.json()["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert page.status_code == 200 and page.headers["Content-Type"].startswith("text/html")
    assert "POST /api/v1/tasks" in page.text and "<script" not in page.text
    assert not re.search(r"""(src|href)=['"]https?://""", page.text)  # self-contained: the hub has no internet
    assert unknown.status_code == 404 and set(unknown.json()) >= {"error", "fix", "request_id"}


async def test_every_route_under_api_v1_is_in_the_spec_with_its_errors_and_patterns(hub):
    app = hub.site_runner.app
    routes = {(r.method, r.resource.canonical) for r in app.router.routes()
              if r.resource is not None and r.resource.canonical.startswith("/api/v1/")
              and r.method != "HEAD"}
    spec = build_spec()
    documented = {(method.upper(), path) for path, ops in spec["paths"].items() for method in ops}
    served = routes - {("GET", "/api/v1/openapi.json"), ("GET", "/api/v1/docs")}
    assert served == documented, (served ^ documented)
    for path, ops in spec["paths"].items():
        for op in ops.values():
            assert {"400", "401", "403", "404", "409", "413", "429", "500"} <= set(op["responses"]), path
            assert op["responses"]["500"]["content"]["application/json"]["schema"]["$ref"].endswith("/Error")
            for p in op.get("parameters", []):
                if p["in"] == "path":
                    assert p["required"] and (p["schema"].get("pattern") or p["schema"].get("enum")), (path, p)


CALL = re.compile(r"""api\.call\(\s*"(GET|POST|PUT|PATCH|DELETE)",\s*f?"([^"]+)\"""")
# a placeholder that is a subcommand stands for each of its words; any other placeholder is one path segment
SUBCOMMANDS = {"{args.schedule_cmd}": ("pause", "resume"), "{args.alerts_cmd}": ("ack", "snooze", "pause")}


def test_the_cli_uses_only_operations_the_spec_describes():
    calls = []
    for source in sorted((ROOT / "hub" / "cli").glob("*.py")):
        for method, template in CALL.findall(source.read_text()):
            variants = [template]
            for placeholder, words in SUBCOMMANDS.items():
                variants = [v.replace(placeholder, w) for v in variants for w in words] \
                    if any(placeholder in v for v in variants) else variants
            calls += [(source.name, method, "/api/v1/" + re.sub(r"\{[^}]+\}", "x", v)) for v in variants]
    assert len(calls) > 20, calls  # the scan still finds the CLI's calls
    spec = build_spec()
    for name, method, path in calls:
        assert any(path_matches(t, path) and method.lower() in ops for t, ops in spec["paths"].items()), \
            f"{name}: {method} {path} is not an operation of /api/v1/openapi.json"


def test_every_operation_is_registered_once():
    keys = [(o.method, o.path) for o in OPS]
    assert len(keys) == len(set(keys)) and len({o.id for o in OPS}) == len(OPS)


REFUSALS = [  # (model, input, part, a fragment the refusal must carry)
    (m.TaskSubmit, {"prompt": "x", "colour": "red"}, "body", "unknown fields ['colour']; a task takes"),
    (m.TaskSubmit, {}, "body", 'prompt is required; send {"prompt"'),
    (m.TaskSubmit, {"prompt": 5}, "body", "prompt should be a valid string"),
    (m.TaskSubmit, {"prompt": "a\x00b"}, "body", "`prompt` contains a NUL byte"),
    (m.TurnSend, {"text": "x", "timeout_s": "abc"}, "body", "timeout_s should be a valid number"),
    (m.TurnSend, {"text": "x", "wait": 1}, "body", "wait should be a valid boolean"),
    (m.SessionCreate, {"name": ["a"]}, "body", "name should be a valid string"),
    (m.TaskListQuery, {"limit": "1e20"}, "query",
     "query parameter limit is not a whole number; it must be a whole number"),
    (m.TaskListQuery, {"limit": "²"}, "query", "query parameter limit is not a whole number"),
    (m.WaitQuery, {"timeout_s": "nan"}, "query", "query parameter timeout_s is not a finite number"),
    (m.AllQuery, {"everyone": "1"}, "query", "unknown query parameters ['everyone']"),
    (m.TaskPath, {"id": "a b"}, "path", "path parameter id should match pattern"),
    (m.MemoryPath, {"key": "k\x00"}, "path", "path parameter key contains a NUL byte"),
    (m.IncidentPath, {"id": "inc_1", "action": "explode"}, "path", "path parameter action should be 'ack'"),
]


@pytest.mark.parametrize("model,data,part,fragment", REFUSALS, ids=[f"{r[0].__name__}-{r[3][:25]}" for r in REFUSALS])
def test_a_refusal_names_the_field_and_the_fix(model, data, part, fragment):
    with pytest.raises(Invalid) as e:
        m.validate(model, data, part)
    assert fragment in e.value.message, e.value.message


async def test_admin_operations_answer_403_before_reading_input_unknown_query_parameters_400_big_bodies_413(hub):
    alice = await hub.token("alice")
    async with httpx2.AsyncClient(base_url=f"{hub.url}/api/v1", timeout=10) as http:
        h = {"Authorization": f"Bearer {alice}"}
        bad_body = await http.put("/credentials/BAD NAME", content=b"[1]", headers=h)
        assert bad_body.status_code == 403 and "admin" in bad_body.json()["fix"], bad_body.text
        manifest = await http.post("/profiles", content=b"x\x00", headers=h)
        assert manifest.status_code == 403, manifest.text
        alerts = await http.get("/alerts?bogus=1", headers=h)
        assert alerts.status_code == 403, alerts.text
        h = {"Authorization": f"Bearer {hub.admin_token}"}
        extra = await http.get("/tasks", params={"limit": 5, "status": "queued"}, headers=h)
        assert extra.status_code == 400 and "unknown query parameters ['status']" in extra.json()["fix"], extra.text
        made = await http.post("/tokens", json={"principal": "bob", "admin": "yes"}, headers=h)
        assert made.status_code == 400 and "admin should be a valid boolean" in made.json()["fix"], made.text
        big = await http.put("/memory/k", json={"value": "x" * (200 * 1024)}, headers=h)
        assert big.status_code == 413 and big.json()["error"] == "too_large", big.text


def _schemathesis() -> str:
    exe = Path(sys.executable).parent / "schemathesis"
    if not exe.exists():
        pytest.fail("schemathesis is not installed: `make test` installs it (pip install -e '.[test]')")
    return str(exe)


async def seed(hub) -> dict[str, list[str]]:
    """Make real things to aim at (a finished task, a session, a schedule, memory, a credential, a spare token)."""
    await hub.start_runner()
    h = {"Authorization": f"Bearer {hub.admin_token}"}
    async with httpx2.AsyncClient(base_url=f"{hub.url}/api/v1", headers=h, timeout=30) as http:
        async def post(method: str, path: str, body: dict) -> dict:
            resp = await http.request(method, path, json=body)
            assert resp.status_code in (200, 201), resp.text
            return resp.json()

        task = await post("POST", "/tasks", {"prompt": "say hi", "profile": "scripted"})
        await http.get(f"/tasks/{task['task_id']}/wait", params={"timeout_s": 20})
        session = await post("POST", "/sessions", {"name": "fuzz-session", "profile": "scripted"})
        turn = await post("POST", f"/sessions/{session['session_id']}/turns", {"text": "say hi", "wait": True,
                                                                                "timeout_s": 20})
        schedule = await post("POST", "/schedules", {"name": "fuzz", "prompt": "say hi", "profile": "scripted",
                                                     "rule": "every 1h"})
        await post("PUT", "/memory/fuzz-key", {"value": "v"})
        await post("PUT", "/credentials/fuzzcred", {"env": ["FUZZ_KEY"]})
        spare = await post("POST", "/tokens", {"principal": "spare", "label": "fuzzed"})
    return {
        "ids": [task["task_id"], turn.get("turn_id") or task["task_id"], schedule["schedule_id"], spare["id"]],
        "refs": ["fuzz-session", session["session_id"], schedule["schedule_id"]],
        "keys": ["fuzz-key"], "names": ["fuzzcred", "r1"], "envs": ["FUZZ_KEY"],
        "profiles": ["scripted"], "prompts": ["say hi", "fail boom", "usage input=3"],
        "rules": ["every 1h", "0 9 * * 1-5", "at 2099-01-01T09:00:00+08:00"],
    }


BINDINGS = {"path.id": "ids", "path.ref": "refs", "path.key": "keys", "path.name": "names", "path.env": "envs",
            "body.profile": "profiles", "body.prompt": "prompts", "body.text": "prompts", "body.rule": "rules"}


def config_file(tmp: Path, values: dict[str, list[str]]) -> Path:
    """A schemathesis.toml that aims half the generated path ids and some body fields at the seeded things."""
    lines = []
    for name, items in values.items():
        lines += [f"[dictionaries.{name}]", f"values = {json.dumps(items)}", ""]
    lines.append("[parameters]")
    lines += [f'"{key}" = {{ dictionary = "{name}", probability = 0.5 }}' for key, name in BINDINGS.items()]
    path = tmp / "schemathesis.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


async def run_fuzz(url: str, token: str, tmp: Path, examples: int, seed_: str,
                   config: Path | None = None) -> tuple[int, str]:
    """Run schemathesis against every operation of a live hub; return its exit code and output."""
    cmd = [_schemathesis(), "--no-color"] + (["--config-file", str(config)] if config else []) + [
           "run", f"{url}/api/v1/openapi.json", "--checks", CHECKS,
           "-H", f"Authorization: Bearer {token}", "--max-examples", str(examples), "--seed", seed_,
           "--phases", os.environ.get("AMUX_FUZZ_PHASES", "examples,fuzzing"), "--workers", "1",
           "--request-timeout", "60", "--suppress-health-check", "all",
           "--report-dir", str(tmp / "schemathesis-report")]
    proc = await asyncio.create_subprocess_exec(*cmd, cwd=tmp, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT)
    out, _ = await proc.communicate()
    return proc.returncode or 0, out.decode(errors="replace")


async def test_schemathesis_finds_no_5xx_and_no_answer_outside_the_schema(any_hub, tmp_path):
    examples = int(os.environ.get("AMUX_FUZZ_EXAMPLES", "12"))
    seed_ = os.environ.get("AMUX_FUZZ_SEED", "14")
    config = config_file(tmp_path, await seed(any_hub))
    code, out = await asyncio.wait_for(run_fuzz(any_hub.url, any_hub.admin_token, tmp_path, examples, seed_, config),
                                       900)
    print(out[-3000:])
    assert code == 0, out[-8000:]
