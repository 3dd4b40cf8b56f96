"""deploy/compose.yaml and deploy/k8s: the structure operators rely on, checked offline.

Compose: parsed with PyYAML (`docker compose config` needs a Docker client with the compose plugin, which this
machine lacks). Kubernetes: `kubectl kustomize` renders the example overlay and every object validates against
the Kubernetes schemas with kubernetes-validate (no cluster)."""
from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tests.helpers import REPO

yaml = pytest.importorskip("yaml")
DEPLOY = REPO / "deploy"
K8S_VERSION = "1.30.0"


# --- Compose ---------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load((DEPLOY / "compose.yaml").read_text())


def test_compose_has_postgres_with_a_volume_a_one_shot_migration_two_hubs_a_proxy_and_a_runner(compose):
    s = compose["services"]
    assert {"db", "migrate", "hub-1", "hub-2", "proxy", "runner"} <= set(s)
    assert any(v.startswith("pgdata:") for v in s["db"]["volumes"]) and "pgdata" in compose["volumes"]
    assert s["migrate"]["command"] == ["db", "upgrade"] and s["migrate"]["restart"] == "no"
    assert s["migrate"]["depends_on"]["db"]["condition"] == "service_healthy"
    for hub in ("hub-1", "hub-2"):
        assert s[hub]["command"][:2] == ["hub", "serve"]
        assert s[hub]["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert s["runner"]["command"][0] == "runner" and "http://proxy:8080" in s["runner"]["command"]
    conf = compose["configs"]["nginx_conf"]["content"]
    assert "server hub-1:8787" in conf and "server hub-2:8787" in conf and "Upgrade" in conf


def test_compose_runs_amux_non_root_on_a_read_only_root_with_state_only_in_amux_home(compose):
    for name in ("migrate", "hub-1", "hub-2", "runner"):
        svc = compose["services"][name]
        assert svc["user"] == "10001:10001" and svc["read_only"] is True and svc["tmpfs"] == ["/tmp"]
        assert svc["cap_drop"] == ["ALL"]
        assert [v.split(":")[1] for v in svc["volumes"]] == ["/var/lib/amux"]
        assert svc["environment"]["AMUX_HOME"] == "/var/lib/amux"


def test_compose_secrets_come_from_the_env_file_and_are_documented(compose):
    text = (DEPLOY / "compose.yaml").read_text()
    used = set(re.findall(r"\$\{([A-Z0-9_]+)", text))
    example = (DEPLOY / ".env.example").read_text()
    documented = set(re.findall(r"^([A-Z0-9_]+)=", example, re.M))
    assert used <= documented, f"not in .env.example: {sorted(used - documented)}"
    for secret in ("AMUX_SECRET_KEY", "POSTGRES_PASSWORD", "FEISHU_APP_SECRET", "AMUX_RUNNER_TOKEN"):
        assert re.search(rf"^{secret}=$", example, re.M), f"{secret} must be empty in the example"
    hub_env = compose["services"]["hub-1"]["environment"]
    assert hub_env["AMUX_SECRET_KEY"].startswith("${AMUX_SECRET_KEY:?")
    assert "${POSTGRES_PASSWORD" in hub_env["AMUX_DATABASE_URL"]


def test_only_the_migration_and_the_hubs_reach_postgres_in_compose(compose):
    s = compose["services"]
    assert compose["networks"]["backend"]["internal"] is True
    on_backend = {n for n, svc in s.items() if "backend" in svc.get("networks", [])}
    assert on_backend == {"db", "migrate", "hub-1", "hub-2"}
    assert "ports" not in s["db"] and list(s) and [n for n, svc in s.items() if "ports" in svc] == ["proxy"]


# --- Kubernetes ------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def rendered() -> list[dict]:
    kubectl = shutil.which("kubectl")
    if not kubectl:
        pytest.fail("kubectl is missing: install it (it carries kustomize) to render deploy/k8s")
    out = subprocess.run([kubectl, "kustomize", str(DEPLOY / "k8s" / "overlays" / "example")],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def _one(objs: list[dict], kind: str, name: str) -> dict:
    found = [o for o in objs if o["kind"] == kind and o["metadata"]["name"].startswith(name)]
    assert len(found) == 1, f"{kind}/{name}: {len(found)} found"
    return found[0]


def test_every_rendered_object_validates_against_the_kubernetes_schemas(rendered):
    kv = pytest.importorskip("kubernetes_validate")
    kinds = set()
    for obj in rendered:
        kv.validate(obj, K8S_VERSION, strict=True)  # raises ValidationError naming the field
        kinds.add(obj["kind"])
    assert {"Deployment", "Service", "Job", "ConfigMap", "Secret", "PodDisruptionBudget", "NetworkPolicy"} <= kinds


def test_the_hub_deployment_runs_two_probed_non_root_replicas_on_a_read_only_root(rendered):
    dep = _one(rendered, "Deployment", "amux-hub")
    assert dep["spec"]["replicas"] == 2 and dep["metadata"]["namespace"] == "amux"
    pod = dep["spec"]["template"]["spec"]
    c = pod["containers"][0]
    assert c["args"][:2] == ["hub", "serve"]
    assert c["readinessProbe"]["httpGet"]["path"] == "/readyz" and c["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert c["resources"]["requests"] and c["resources"]["limits"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert "emptyDir" in volumes[mounts["/var/lib/amux"]] and "emptyDir" in volumes[mounts["/tmp"]]
    assert {e["name"]: e.get("value") for e in c["env"]}["AMUX_HOME"] == "/var/lib/amux"
    secret_env = {e["name"] for e in c["env"] if "valueFrom" in e}
    assert {"AMUX_DATABASE_URL", "AMUX_SECRET_KEY"} <= secret_env
    pdb = _one(rendered, "PodDisruptionBudget", "amux-hub")
    assert pdb["spec"]["selector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    svc = _one(rendered, "Service", "amux-hub")
    assert svc["spec"]["selector"] == dep["spec"]["selector"]["matchLabels"]


def test_the_migration_job_and_the_runner_take_their_secrets_from_secrets(rendered):
    job = _one(rendered, "Job", "amux-migrate")
    assert job["spec"]["template"]["spec"]["containers"][0]["args"] == ["db", "upgrade"]
    runner = _one(rendered, "Deployment", "amux-runner")
    c = runner["spec"]["template"]["spec"]["containers"][0]
    token = next(e for e in c["env"] if e["name"] == "AMUX_TOKEN")
    ref = token["valueFrom"]["secretKeyRef"]["name"]
    assert ref.startswith("amux-runner-token") and _one(rendered, "Secret", ref)
    assert c["securityContext"]["readOnlyRootFilesystem"] is True
    cm = _one(rendered, "ConfigMap", "amux-config")
    assert "amux.toml" in cm["data"]
    hub = _one(rendered, "Deployment", "amux-hub")["spec"]["template"]["spec"]
    assert next(v for v in hub["volumes"] if v["name"] == "config")["configMap"]["name"] == cm["metadata"]["name"]


def test_network_policies_let_runners_and_the_ingress_reach_the_hub_and_only_hubs_reach_postgres(rendered):
    pols = {p["metadata"]["name"]: p["spec"] for p in rendered if p["kind"] == "NetworkPolicy"}
    assert pols["amux-default-deny-ingress"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    hub_from = pols["amux-hub-ingress"]["ingress"][0]["from"]
    assert any(f.get("podSelector", {}).get("matchLabels", {}).get("app.kubernetes.io/component") == "runner"
               for f in hub_from)
    assert any("namespaceSelector" in f for f in hub_from)
    db = pols["amux-database-ingress"]
    assert db["podSelector"]["matchLabels"] == {"app.kubernetes.io/component": "database"}
    (rule,) = db["ingress"]
    (peer,) = rule["from"]
    assert peer["podSelector"]["matchExpressions"][0]["values"] == ["hub", "migrate"]
    pg = _one(rendered, "StatefulSet", "amux-postgres")
    assert pg["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "database"


def test_the_kubernetes_runner_takes_its_runtime_name_from_its_pod_so_scaling_gives_distinct_runtimes(rendered):
    runner = _one(rendered, "Deployment", "amux-runner")
    c = runner["spec"]["template"]["spec"]["containers"][0]
    name = c["args"][c["args"].index("--name") + 1]
    assert name == "$(POD_NAME)"
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    # $(VAR) in args expands only from a variable defined earlier in the container's env.
    assert c["env"].index(env["POD_NAME"]) == 0


def test_compose_requires_no_feishu_variable_and_configures_an_app_only_when_one_is_given(compose):
    text = (DEPLOY / "compose.yaml").read_text()
    required = set(re.findall(r"\$\{([A-Z0-9_]+):\?", text))
    assert required == {"POSTGRES_PASSWORD", "AMUX_SECRET_KEY"}, required
    assert "[[feishu.apps]]" not in compose["configs"]["amux_toml"]["content"]
    assert "[[feishu.apps]]" in compose["configs"]["feishu_toml"]["content"]
    for hub in ("hub-1", "hub-2"):
        svc = compose["services"][hub]
        script = svc["entrypoint"][2].replace("$$", "$")
        assert svc["entrypoint"][:2] == ["sh", "-c"] and 'if [ -n "${FEISHU_APP_ID:-}" ]' in script
        assert svc["environment"]["FEISHU_APP_ID"] == "${FEISHU_APP_ID:-}"


@pytest.mark.parametrize("with_app", [False, True])
def test_the_compose_hub_entrypoint_adds_the_feishu_table_only_when_an_app_id_is_set(compose, tmp_path, with_app):
    svc = compose["services"]["hub-1"]
    script = svc["entrypoint"][2].replace("$$", "$").replace("/tmp/amux.toml", "/etc/amux/out-amux.toml")
    script = script.replace("/etc/amux", str(tmp_path))
    (tmp_path / "amux.toml").write_text("[hub]\n")
    (tmp_path / "feishu.toml").write_text("[[feishu.apps]]\n")
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "amux").write_text('#!/bin/sh\necho "$@"\n')
    (bindir / "amux").chmod(0o755)
    env = {"PATH": f"{bindir}:/usr/bin:/bin", **({"FEISHU_APP_ID": "cli_x"} if with_app else {})}
    out = subprocess.run(["sh", "-c", script, *svc["entrypoint"][3:], *svc["command"]], env=env,
                         capture_output=True, text=True, check=True).stdout.split()
    assert out[:2] == ["hub", "serve"] and out[2] == "--config"
    cfg = out[3]
    assert cfg == (f"{tmp_path}/out-amux.toml" if with_app else f"{tmp_path}/amux.toml")
    assert ("[[feishu.apps]]" in (tmp_path / cfg).read_text()) is with_app


def test_compose_runner_names_no_runtime_so_each_replica_registers_under_its_own_hostname(compose):
    command = compose["services"]["runner"]["command"]
    assert "--name" not in command, command  # a fixed name would make `--scale runner=N` replicas collide
