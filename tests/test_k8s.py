"""Docker and Kubernetes files, validated offline: hadolint, kubectl kustomize, kubernetes-validate --strict,
check-jsonschema against KubeRay's fields, Ray's ServeDeploySchema, and the real app builder."""

from __future__ import annotations

import importlib
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from .conftest import REPO

K8S = REPO / "deploy" / "k8s"
Rendered = tuple[str, list[dict[str, Any]], Path]  # (overlay, documents, rendered file)
BIN = Path(sys.executable).parent


def tool(name: str) -> str:
    path = shutil.which(name, path=str(BIN)) or shutil.which(name)
    assert path, f"{name} is not installed (make test installs the dev dependencies; kubectl comes with the machine)"
    return path


def run(*args: str | Path, cwd: Path = REPO) -> str:
    proc = subprocess.run([str(a) for a in args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc.stdout + proc.stderr


@pytest.fixture(scope="module", params=["gpu", "cpu"])
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    out = run(tool("kubectl"), "kustomize", K8S / "overlays" / request.param)
    path = tmp_path_factory.mktemp("k8s") / f"{request.param}.yaml"
    path.write_text(out)
    return request.param, [d for d in yaml.safe_load_all(out) if d], path


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind)


def test_dockerfile_passes_hadolint_and_has_what_an_operator_needs() -> None:
    assert run(tool("hadolint"), "Dockerfile").strip() == ""
    text = (REPO / "Dockerfile").read_text()
    assert "FROM rayproject/ray:${RAY_VERSION}-py311-${FLAVOR}" in text and "ARG FLAVOR=gpu" in text
    assert "EXPOSE 8000 8080" in text and "/healthz" in text and "USER 1000" in text
    assert 'CMD ["beamserve", "serve"]' in text
    assert "RAY_AUTH_MODE" not in text and "BEAMSERVE_METRICS_HOST=0.0.0.0" in text  # Ray stays on loopback
    assert ".venv" in (REPO / ".dockerignore").read_text()


def test_core_objects_pass_kubernetes_validate_strict(rendered: Rendered) -> None:
    _, _, path = rendered
    out = run(tool("kubernetes-validate"), "--strict", path)
    assert "passed for resource service/beamserve" in out
    assert "passed for resource poddisruptionbudget/beamserve-workers" in out


def test_rayservice_and_podmonitor_match_their_schemas(
    rendered: Rendered,
    tmp_path: Path,
) -> None:
    _, docs, _ = rendered
    for kind, schema in (("RayService", "rayservice"), ("PodMonitor", "podmonitor")):
        doc = tmp_path / f"{schema}.yaml"
        doc.write_text(yaml.safe_dump(by_kind(docs, kind)))
        run(tool("check-jsonschema"), "--schemafile", K8S / "schemas" / f"{schema}.schema.json", doc)


def test_rayservice_pod_templates_are_valid_pod_templates(
    rendered: Rendered,
    tmp_path: Path,
) -> None:
    _, docs, _ = rendered
    cluster = by_kind(docs, "RayService")["spec"]["rayClusterConfig"]
    groups = [("head", cluster["headGroupSpec"])] + [(g["groupName"], g) for g in cluster["workerGroupSpecs"]]
    for name, group in groups:
        doc = tmp_path / f"{name}.yaml"
        doc.write_text(
            yaml.safe_dump(
                {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": group["template"]}
            )
        )
        assert "passed" in run(tool("kubernetes-validate"), "--strict", doc)


def test_serve_config_v2_equals_deploy_serve_config_and_builds(rendered: Rendered) -> None:
    from ray.serve.schema import ServeDeploySchema

    _, docs, _ = rendered
    embedded = yaml.safe_load(by_kind(docs, "RayService")["spec"]["serveConfigV2"])
    assert embedded == yaml.safe_load((REPO / "deploy" / "serve_config.yaml").read_text())
    app = ServeDeploySchema.model_validate(embedded).applications[0]
    module, attr = app.import_path.split(":")
    built = getattr(importlib.import_module(module), attr)(app.args)
    assert built._bound_deployment.name == "Gateway"
    for d in app.deployments:
        assert d.autoscaling_config["min_replicas"] >= 1 and d.autoscaling_config["target_ongoing_requests"] > 0


def test_overlays_set_gpu_drain_probes_and_shared_memory(rendered: Rendered) -> None:
    flavor, docs, _ = rendered
    rs = by_kind(docs, "RayService")
    cluster = rs["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["authOptions"] == {"mode": "token"}  # KubeRay makes the token Secret and sets it everywhere
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    worker_group = cluster["workerGroupSpecs"][0]
    pod = worker_group["template"]["spec"]
    worker = pod["containers"][0]
    gpus = "1" if flavor == "gpu" else "0"
    assert {e["name"]: e["value"] for e in head["env"]}["BEAMSERVE_REPLICA_GPUS"] == gpus
    assert worker["image"] == head["image"] == f"beamserve:{flavor}"
    for kind in ("requests", "limits"):
        assert worker["resources"][kind].get("nvidia.com/gpu") == ("1" if flavor == "gpu" else None)
    assert worker["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert worker["livenessProbe"]["httpGet"]["path"] == "/healthz"
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert any(m["mountPath"] == "/dev/shm" for m in worker["volumeMounts"])
    serve = yaml.safe_load(rs["spec"]["serveConfigV2"])
    drain = max(d.get("graceful_shutdown_timeout_s", 20) for d in serve["applications"][0]["deployments"])
    assert pod["terminationGracePeriodSeconds"] > drain
    assert worker_group["minReplicas"] <= worker_group["replicas"] <= worker_group["maxReplicas"]
    service = by_kind(docs, "Service")
    assert service["spec"]["ports"][0]["port"] == 8000
    assert by_kind(docs, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert any(p["name"] == "metrics" and p["containerPort"] == 8080 for p in worker["ports"])


def test_ingress_example_is_valid_and_agrees_with_the_server_limits() -> None:
    from service.settings import Settings

    path = K8S / "examples" / "ingress-nginx.yaml"
    assert "passed for resource ingress/beamserve" in run(tool("kubernetes-validate"), "--strict", path)
    ingress = yaml.safe_load(path.read_text())
    notes = {k.removeprefix("nginx.ingress.kubernetes.io/"): v for k, v in ingress["metadata"]["annotations"].items()}
    settings = Settings()
    # nginx holds slow bodies; beamserve's JSON 504 and 413 come before nginx's own pages.
    assert notes["proxy-request-buffering"] == "on"
    assert float(notes["proxy-read-timeout"]) > settings.request_timeout_s
    assert notes["proxy-body-size"] == "1m" and settings.max_body_bytes <= 2**20
    assert ingress["spec"]["tls"] and ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"] == {
        "name": "beamserve",
        "port": {"number": 8000},
    }


def test_api_keys_example_mounts_the_keys_file_everywhere_and_counts_in_its_store(tmp_path: Path) -> None:
    from service.keys import KeyLimits, load_keys

    out = run(tool("kubectl"), "kustomize", K8S / "examples" / "api-keys")
    path = tmp_path / "api-keys.yaml"
    path.write_text(out)
    assert "passed for resource deployment/beamserve-limits" in run(tool("kubernetes-validate"), "--strict", path)
    docs = [d for d in yaml.safe_load_all(out) if d]
    cluster = by_kind(docs, "RayService")["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in head["containers"][0]["env"]}
    store = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "beamserve-limits")
    assert env["BEAMSERVE_LIMITS_STORAGE"] == f"redis://beamserve-limits:{store['spec']['ports'][0]['port']}/0"
    # The Gateway replica may run on the head or a worker: both mount the keys where the setting says.
    for pod in (head, *(g["template"]["spec"] for g in cluster["workerGroupSpecs"])):
        mount = next(m for m in pod["containers"][0]["volumeMounts"] if m["name"] == "api-keys")
        assert env["BEAMSERVE_API_KEYS_FILE"] == mount["mountPath"] + "/keys.json"
        assert any(v.get("secret", {}).get("secretName") == "beamserve-api-keys" for v in pod["volumes"])
    keys_file = tmp_path / "keys.json"
    keys_file.write_text(by_kind(docs, "Secret")["stringData"]["keys.json"])
    clients = load_keys("", str(keys_file), KeyLimits())
    assert {c.id for c in clients.values()} == {"newsroom", "mastodon"}
