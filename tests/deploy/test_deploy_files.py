"""The deployment files (``Dockerfile``, ``compose.yaml``, ``deploy/k8s/``) kept true without a
container daemon: the manifests validate against the Kubernetes API schemas
(kubernetes-validate), the Dockerfile passes hadolint, and every command line in them parses
with ``carpool serve``'s own parser into a config that builds, with the ports, probes,
environment variables and grace periods agreeing with what that config says."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from gateway.cli.main import CONFIG_FLAGS, build_parser
from gateway.config import GatewayConfig

REPO = Path(__file__).resolve().parents[2]
K8S = REPO / "deploy" / "k8s"
OLDEST_K8S = "1.29"  # PodDisruptionBudget policy/v1 and every field used here exist since


def k8s_docs() -> list[tuple[str, dict[str, Any]]]:
    return [(path.name, doc) for path in sorted(K8S.glob("*.yaml"))
            if path.name != "kustomization.yaml"
            for doc in yaml.safe_load_all(path.read_text()) if doc]


def of_kind(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for _, doc in k8s_docs() if doc["kind"] == kind}


def serve_config(args: list[str], env: dict[str, str]) -> GatewayConfig:
    """The config ``carpool serve ARGS`` runs with under ``env`` (an unknown flag, a bad
    value or a bad combination fails here as it would in the container)."""
    ns = build_parser().parse_args(["serve", *args])
    return GatewayConfig.from_env(env, **{k: getattr(ns, k) for k in CONFIG_FLAGS})


def carpool_env_names(env: dict[str, str]) -> None:
    fields = {f"CARPOOL_{name.upper()}" for name in GatewayConfig.__dataclass_fields__}
    unknown = {k for k in env if k.startswith("CARPOOL_")} - fields
    assert not unknown, f"not read by GatewayConfig: {unknown}"


# -- Kubernetes ------------------------------------------------------------------------------

@pytest.mark.parametrize("version", [OLDEST_K8S, kubernetes_validate.latest_version()])
def test_every_manifest_validates_against_the_api_schemas(version: str) -> None:
    docs = k8s_docs()
    assert {d["kind"] for _, d in docs} >= {"Deployment", "Service", "PodDisruptionBudget",
                                             "Secret"}
    for _, doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)  # raises, naming the field
    listed = yaml.safe_load((K8S / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in K8S.glob("*.yaml")
                                    if p.name not in ("kustomization.yaml",
                                                      "secret.example.yaml"))


def test_the_validator_refuses_a_broken_manifest() -> None:
    doc = copy.deepcopy(of_kind("Deployment")["carpool-gateway"])
    doc["spec"]["template"]["spec"]["containers"][0]["ports"][0]["containerPort"] = "http"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)
    doc = copy.deepcopy(of_kind("Deployment")["carpool-gateway"])
    doc["spec"]["template"]["spec"]["terminationGracePeriod"] = 45  # a misspelt field
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(doc, kubernetes_validate.latest_version(), strict=True)


def container_env(container: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any]]:
    plain = {e["name"]: e["value"] for e in container.get("env", []) if "value" in e}
    refs = {e["name"]: e["valueFrom"] for e in container.get("env", []) if "valueFrom" in e}
    return plain, refs


@pytest.mark.parametrize("name,role", [("carpool-gateway", "gateway"),
                                       ("carpool-worker", "worker")])
def test_deployments_agree_with_the_cli(name: str, role: str) -> None:
    dep = of_kind("Deployment")[name]
    pod = dep["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    plain, refs = container_env(container)
    carpool_env_names({**plain, **{k: "x" for k in refs}})
    config = serve_config(container["args"], {**plain, "CARPOOL_SECRET": "s"})
    assert config.role == role and config.host == "0.0.0.0"
    assert plain["REDIS_URL"].startswith("redis://")
    # a stop gets the drain deadline and some seconds more before its SIGKILL
    assert pod["terminationGracePeriodSeconds"] >= config.drain_timeout_s + 10
    assert pod["securityContext"]["runAsNonRoot"] is True
    requests = container["resources"]["requests"]
    assert requests.get("cpu") and requests.get("memory")
    # the secret comes from the Secret, never a literal
    secret = of_kind("Secret")["carpool-secrets"]
    assert "CARPOOL_SECRET" not in plain
    for ref in refs.values():
        key = ref["secretKeyRef"]
        assert key["name"] == "carpool-secrets" and key["key"] in secret["stringData"]
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    if role == "gateway":
        assert ports == {"http": config.port}
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert {container["livenessProbe"]["httpGet"]["port"],
                container["readinessProbe"]["httpGet"]["port"]} == {"http"}
        assert "CARPOOL_ADMIN_KEY" in refs
    else:
        assert ports == {"metrics": config.metrics_port} and config.metrics_port > 0
        assert container["livenessProbe"]["httpGet"]["port"] == "metrics"
    labels = dep["spec"]["template"]["metadata"]["labels"]
    assert dep["spec"]["selector"]["matchLabels"].items() <= labels.items()
    pdbs = [p for p in of_kind("PodDisruptionBudget").values()
            if p["spec"]["selector"]["matchLabels"].items() <= labels.items()]
    assert len(pdbs) == 1
    assert dep["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    services = [s for s in of_kind("Service").values()
                if s["spec"]["selector"].items() <= labels.items()]
    assert services and all(p["targetPort"] in ports for s in services
                            for p in s["spec"]["ports"])


def test_the_workers_reach_the_redis_service() -> None:
    redis = of_kind("Service")["carpool-redis"]
    for name in ("carpool-gateway", "carpool-worker"):
        (container,) = of_kind("Deployment")[name]["spec"]["template"]["spec"]["containers"]
        plain, _ = container_env(container)
        host, port = re.match(r"redis://([^:/]+):(\d+)", plain["REDIS_URL"]).groups()  # type: ignore[union-attr]
        assert host == redis["metadata"]["name"]
        assert int(port) in [p["port"] for p in redis["spec"]["ports"]]
    (container,) = of_kind("Deployment")["carpool-redis"]["spec"]["template"]["spec"][
        "containers"]
    assert "--appendonly" in container["args"]


# -- Dockerfile -------------------------------------------------------------------------------

def dockerfile() -> list[tuple[str, str]]:
    """(instruction, rest) per instruction, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (REPO / "Dockerfile").read_text())
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1])
            for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]


def test_hadolint_passes_the_dockerfile() -> None:
    hadolint = Path(sys.executable).parent / "hadolint"
    done = subprocess.run([str(hadolint), "--no-color", str(REPO / "Dockerfile")],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_dockerfile_installs_the_locks_runs_carpool_serve_as_non_root() -> None:
    import json

    steps = dockerfile()
    runs = " ".join(rest for kind, rest in steps if kind == "RUN")
    for lock in ("requirements/serve.lock", "requirements/model.lock"):
        assert re.search(rf"--require-hashes --no-deps .*-r {lock}", runs), lock
        assert (REPO / lock).exists()
    user = [rest for kind, rest in steps if kind == "USER"]
    assert user and user[-1].strip() not in ("root", "0")
    copied = {rest.split()[0] for kind, rest in steps if kind == "COPY"}
    pyproject = (REPO / "pyproject.toml").read_text()
    packages = re.search(r'include = \[([^\]]*)\]', pyproject).group(1)  # type: ignore[union-attr]
    assert {p.strip(' "*') for p in packages.split(",")} <= copied
    entry = json.loads(next(rest for kind, rest in steps if kind == "ENTRYPOINT"))
    assert entry == ["carpool", "serve"] and 'carpool = "gateway.cli.main:main"' in pyproject
    cmd = json.loads(next(rest for kind, rest in steps if kind == "CMD"))
    config = serve_config(cmd, {})
    exposed = {int(p) for kind, rest in steps if kind == "EXPOSE" for p in rest.split()}
    assert config.port in exposed and config.host == "0.0.0.0"
    worker = of_kind("Deployment")["carpool-worker"]["spec"]["template"]["spec"]
    wconfig = serve_config(worker["containers"][0]["args"], {})
    assert wconfig.metrics_port in exposed


# -- compose ----------------------------------------------------------------------------------

def test_compose_runs_redis_with_aof_two_gateways_and_two_workers() -> None:
    compose = yaml.safe_load((REPO / "compose.yaml").read_text())
    services = compose["services"]
    assert "--appendonly" in services["redis"]["command"]
    roles: dict[str, list[str]] = {}
    for name, svc in services.items():
        if name == "redis":
            continue
        env = {k: str(v) for k, v in svc["environment"].items()}
        carpool_env_names(env)
        config = serve_config(svc["command"], {**env, "CARPOOL_SECRET": "s"})
        roles.setdefault(config.role, []).append(name)
        assert env["REDIS_URL"] == "redis://redis:6379/0"
        grace = int(svc["stop_grace_period"].rstrip("s"))
        assert grace >= config.drain_timeout_s + 10
        assert config.host == "0.0.0.0"
        if config.role == "gateway":
            published = {int(p.split(":")[1]) for p in svc["ports"]}
            assert published == {config.port}
            probe = " ".join(svc["healthcheck"]["test"])
            assert f"127.0.0.1:{config.port}/readyz" in probe
    assert {r: len(n) for r, n in roles.items()} == {"gateway": 2, "worker": 2}
