"""Docker and Kubernetes files, validated offline: hadolint, kubectl kustomize on every overlay and
example and helm template on the chart, kubernetes-validate --strict, check-jsonschema against
KubeRay v1.7's RayService fields, the restricted Pod Security Standard (tests/pod_security.py), Ray's
ServeDeploySchema, and the real app builder."""

from __future__ import annotations

import copy
import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from . import pod_security
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


# Everything a user applies: the two overlays and the examples built on them, and the Helm chart
# (deploy/k8s/Chart.yaml) with each of its test values (deploy/k8s/ci/NAME-values.yaml).
RENDERS = ["overlays/gpu", "overlays/cpu", "examples/api-keys", "examples/production"]
RENDERS += ["helm/cpu", "helm/production", "helm/registry"]
SERVE_CONFIG_AS_WRITTEN = set(RENDERS) - {"helm/registry"}  # the rest set the models or the args


def render(name: str, *options: str) -> str:
    """The manifests of a kustomization under deploy/k8s, or of the chart with helm/NAME's values."""
    if name.startswith("helm/"):
        values = K8S / "ci" / f"{name.removeprefix('helm/')}-values.yaml"
        proc = subprocess.run(
            [tool("helm"), "template", "beamserve", str(K8S), "-f", str(values), *options],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert proc.returncode == 0 and not proc.stderr, proc.stderr
        return proc.stdout
    return run(tool("kubectl"), "kustomize", K8S / name)


@pytest.fixture(scope="module", params=RENDERS)
def rendered(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Rendered:
    out = render(request.param)
    path = tmp_path_factory.mktemp("k8s") / f"{request.param.replace('/', '-')}.yaml"
    path.write_text(out)
    return request.param, [d for d in yaml.safe_load_all(out) if d], path


def by_kind(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next(d for d in docs if d["kind"] == kind)


def flavor_of(name: str) -> str:
    return "gpu" if name in ("overlays/gpu", "examples/production", "helm/production") else "cpu"


def test_dockerfile_passes_hadolint_and_has_what_an_operator_needs() -> None:
    assert run(tool("hadolint"), "Dockerfile").strip() == ""
    text = (REPO / "Dockerfile").read_text()
    # One CUDA (torch's wheels) on Ray's CPU image; the CPU flavour the default.
    assert "ARG BASE=rayproject/ray:2.60.0-py311-cpu" in text and "\nFROM ${BASE}\n" in text and "-gpu" not in text
    assert "ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu" in text
    assert "--require-hashes --no-deps -r deploy/requirements.lock" in text
    # The C kernels built in a stage of their own; the runtime stage installs that wheel and has no compiler.
    build, runtime = text.split("FROM ${BASE} AS build\n")[1].split("\nFROM ${BASE}\n")
    assert "gcc" in build and "pip wheel" in build and "model/kernels/_native" in build
    assert "gcc" not in runtime and "COPY --from=build" in runtime and "--no-deps /home/ray/wheels/*.whl" in runtime
    assert "EXPOSE 8000 8080" in text and "USER 1000" in text
    # The health check on the port the container serves; the stop timeout the drain needs, said.
    assert 'CMD ["beamserve", "healthcheck"]' in text and "--stop-timeout 50" in text
    assert 'CMD ["beamserve", "serve"]' in text
    assert "RAY_AUTH_MODE" not in text and "BEAMSERVE_METRICS_HOST=0.0.0.0" in text  # Ray stays on loopback
    assert ".venv" in (REPO / ".dockerignore").read_text()


def test_the_lock_pins_every_dependency_with_hashes() -> None:
    import tomllib

    from packaging.requirements import Requirement

    lock = (REPO / "deploy" / "requirements.lock").read_text()
    pinned: dict[str, str] = {}
    for block in lock.split("\n"):
        if block and not block.startswith((" ", "#")):
            name, _, version = block.split(" ")[0].partition("==")
            pinned[name.split("[")[0].lower().replace("_", "-")] = version
    entries = [b for b in lock.split("\n") if b and not b.startswith((" ", "#"))]
    assert all(e.endswith("\\") for e in entries)  # each followed by its --hash lines
    assert lock.count("--hash=sha256:") >= len(entries)
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for spec in project["dependencies"] + project["optional-dependencies"]["serve"]:
        req = Requirement(spec)
        if req.name == "torch":  # installed from the PyTorch index of the image's flavour
            assert req.name not in pinned
            continue
        name = req.name.lower().replace("_", "-")  # as the lock spells it
        assert name in pinned, f"{req.name} is not in deploy/requirements.lock: run make lock"
        assert req.specifier.contains(pinned[name]), f"{spec} against {pinned[name]}"


def test_every_core_object_passes_kubernetes_validate_strict(rendered: Rendered, tmp_path: Path) -> None:
    _, docs, path = rendered
    out = run(tool("kubernetes-validate"), "--strict", path)
    assert "passed for resource poddisruptionbudget/beamserve-workers" in out
    assert "passed for resource networkpolicy/beamserve-ray" in out
    # The core objects inside the RayService: its pod templates and the Service KubeRay makes from serveService.
    cluster = by_kind(docs, "RayService")["spec"]["rayClusterConfig"]
    groups = [("head", cluster["headGroupSpec"])] + [(g["groupName"], g) for g in cluster["workerGroupSpecs"]]
    inner = [
        {"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": name}, "template": group["template"]}
        for name, group in groups
    ]
    inner.append({"apiVersion": "v1", "kind": "Service", **by_kind(docs, "RayService")["spec"]["serveService"]})
    doc = tmp_path / "inner.yaml"
    doc.write_text(yaml.safe_dump_all(inner))
    out = run(tool("kubernetes-validate"), "--strict", doc)
    assert out.count("passed for resource") == len(inner), out


def test_rayservice_and_podmonitor_match_their_schemas(rendered: Rendered, tmp_path: Path) -> None:
    _, docs, _ = rendered
    for kind, schema in (("RayService", "rayservice"), ("PodMonitor", "podmonitor")):
        doc = tmp_path / f"{schema}.yaml"
        doc.write_text(yaml.safe_dump(by_kind(docs, kind)))
        run(tool("check-jsonschema"), "--schemafile", K8S / "schemas" / f"{schema}.schema.json", doc)


def schema_errors(doc: dict[str, Any]) -> list[str]:
    import jsonschema

    schema = json.loads((K8S / "schemas" / "rayservice.schema.json").read_text())
    return [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(doc)]


def test_the_rayservice_schema_accepts_valid_kuberay_fields_and_rejects_typos() -> None:
    docs = [d for d in yaml.safe_load_all(run(tool("kubectl"), "kustomize", K8S / "overlays" / "cpu")) if d]
    base = by_kind(docs, "RayService")
    assert schema_errors(base) == []
    # Valid KubeRay v1.7 fields the manifests do not use pass, as they are.
    valid = copy.deepcopy(base)
    valid["spec"]["rayClusterConfig"]["managedBy"] = "ray.io/kuberay-operator"
    valid["spec"]["rayClusterConfig"]["headGroupSpec"]["enableIngress"] = False
    valid["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["idleTimeoutSeconds"] = 60
    valid["spec"]["upgradeStrategy"] = {
        "type": "NewClusterWithIncrementalUpgrade",
        "clusterUpgradeOptions": {"stepSizePercent": 10, "intervalSeconds": 30, "gatewayClassName": "istio"},
    }
    assert schema_errors(valid) == []
    # A misspelt field, a wrong type, a value outside an enum: each rejected.
    for path, value in (
        (("spec", "excludeHeadPodFromServSvc"), True),
        (("spec", "upgradeStrategy"), {"type": "BlueGreen"}),
        (("spec", "rayClusterConfig", "authOptions"), {"mode": "tokens"}),
        (("spec", "rayClusterConfig", "workerGroupSpecs", 0, "maxReplicas"), "4"),
        (("spec", "rayClusterConfig", "headGroupSpec", "rayStartParams", "num-cpus"), 0),
        (("spec", "rayClusterConfig", "gcsFaultToleranceOptions"), {"redisAdress": "redis:6379"}),
    ):
        bad = copy.deepcopy(base)
        target = bad
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
        assert schema_errors(bad), f"{path} = {value!r} passed"


def test_every_pod_meets_the_restricted_pod_security_standard(rendered: Rendered) -> None:
    _, docs, _ = rendered
    pods = [pod for doc in docs for pod in pod_security.pod_specs(doc)]
    assert len(pods) >= 3  # head, workers, KubeRay's autoscaler sidecar
    for name, spec in pods:
        assert pod_security.violations(spec, name) == []
    # The check can fail: a container without its securityContext is named.
    name, spec = pods[0]
    bare = copy.deepcopy(spec)
    bare["containers"][0].pop("securityContext")
    assert any("allowPrivilegeEscalation" in v for v in pod_security.violations(bare, name))


def test_serve_config_v2_equals_deploy_serve_config_and_builds(rendered: Rendered) -> None:
    from ray.serve.schema import ServeDeploySchema

    name, docs, _ = rendered
    embedded = yaml.safe_load(by_kind(docs, "RayService")["spec"]["serveConfigV2"])
    if name in SERVE_CONFIG_AS_WRITTEN:
        assert embedded == yaml.safe_load((REPO / "deploy" / "serve_config.yaml").read_text())
    app = ServeDeploySchema.model_validate(embedded).applications[0]
    assert app.logging_config is not None and app.logging_config.encoding == "JSON"
    module, attr = app.import_path.split(":")
    built = getattr(importlib.import_module(module), attr)(app.args)
    assert built._bound_deployment.name == "Gateway"
    for d in app.deployments:
        assert d.autoscaling_config["min_replicas"] >= 1 and d.autoscaling_config["target_ongoing_requests"] > 0
        if d.name.startswith("model-"):  # spread: no node holds all of a pair's replicas at full scale
            assert d.max_replicas_per_node < d.autoscaling_config["max_replicas"]


def test_kuberay_wiring_as_its_authors_intend(rendered: Rendered) -> None:
    _, docs, _ = rendered
    rs = by_kind(docs, "RayService")
    spec = rs["spec"]
    cluster = spec["rayClusterConfig"]
    # KubeRay's own serve Service (it selects this cluster's pods with a healthy proxy, and switches
    # cluster only when the new one is ready), no hand-made one; the head out of it.
    assert spec["serveService"]["metadata"]["name"] == "beamserve" and "selector" not in spec["serveService"]["spec"]
    assert spec["serveService"]["spec"]["ports"][0]["port"] == 8000
    assert not [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == "beamserve"]
    assert spec["excludeHeadPodFromServeSvc"] is True
    assert spec["upgradeStrategy"] == {"type": "NewCluster"}
    assert cluster["authOptions"] == {"mode": "token"}  # KubeRay makes the token Secret and sets it everywhere
    assert cluster["enableInTreeAutoscaling"] is True
    # KubeRay's default probes, not ours: none set on a Ray container.
    head_pod = cluster["headGroupSpec"]["template"]["spec"]
    worker_group = cluster["workerGroupSpecs"][0]
    pod = worker_group["template"]["spec"]
    for container in (head_pod["containers"][0], pod["containers"][0]):
        assert not {"readinessProbe", "livenessProbe", "startupProbe"} & container.keys()
    # A drain proceeds one worker at a time, and with two workers no pair empties.
    pdb = by_kind(docs, "PodDisruptionBudget")
    assert pdb["spec"] == {**pdb["spec"], "maxUnavailable": 1} and "minAvailable" not in pdb["spec"]
    assert worker_group["minReplicas"] >= 2 and worker_group["minReplicas"] <= worker_group["maxReplicas"]
    assert pdb["spec"]["selector"]["matchLabels"].items() <= worker_group["template"]["metadata"]["labels"].items()
    spread = {c["topologyKey"] for c in pod["topologySpreadConstraints"]}
    assert spread == {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
    serve = yaml.safe_load(spec["serveConfigV2"])
    drain = max(d.get("graceful_shutdown_timeout_s", 20) for d in serve["applications"][0]["deployments"])
    assert pod["terminationGracePeriodSeconds"] > drain
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert by_kind(docs, "PodMonitor")["spec"]["podMetricsEndpoints"][0]["port"] == "metrics"
    assert any(p["name"] == "metrics" and p["containerPort"] == 8080 for p in pod["containers"][0]["ports"])


def test_every_ray_container_carries_the_http_front_and_its_setup_hook(
    rendered: Rendered, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The front's switches and limits, and front.SETUP_HOOK as Ray's worker setup hook, in every Ray
    container: Serve's proxy and HAProxy manager start in Ray workers that only the pods' environment
    reaches (tests/test_chaos.py runs a cluster from it)."""
    from ray._private import ray_constants

    from service.api import front
    from service.settings import Settings

    assert front.SETUP_HOOK_ENV == ray_constants.WORKER_PROCESS_SETUP_HOOK_ENV_VAR  # Ray's name for it
    for name in [k for k in os.environ if k.startswith("BEAMSERVE_")]:  # the defaults, not this process's
        monkeypatch.delenv(name)
    _, docs, _ = rendered
    spec = by_kind(docs, "RayService")["spec"]
    args = yaml.safe_load(spec["serveConfigV2"])["applications"][0]["args"]
    want = front.cluster_environment(front.limits_of(Settings(request_timeout_s=args["request_timeout_s"])))
    cluster = spec["rayClusterConfig"]
    for group in (cluster["headGroupSpec"], cluster["workerGroupSpecs"][0]):
        env = {e["name"]: str(e["value"]) for e in group["template"]["spec"]["containers"][0]["env"]}
        assert env.items() >= want.items(), group.get("groupName", "head")


def test_gpu_workers_pack_replicas_as_their_cpus_allow(rendered: Rendered) -> None:
    name, docs, _ = rendered
    cluster = by_kind(docs, "RayService")["spec"]["rayClusterConfig"]
    head = cluster["headGroupSpec"]["template"]["spec"]["containers"][0]
    worker = cluster["workerGroupSpecs"][0]["template"]["spec"]["containers"][0]
    flavor = flavor_of(name)
    assert worker["image"] == head["image"] == f"beamserve:{flavor}"
    share = float({e["name"]: e["value"] for e in head["env"]}["BEAMSERVE_REPLICA_GPUS"])
    serve = yaml.safe_load(by_kind(docs, "RayService")["spec"]["serveConfigV2"])
    replica_cpus = float(serve["applications"][0]["args"]["replica_cpus"])
    for kind in ("requests", "limits"):
        assert worker["resources"][kind].get("nvidia.com/gpu") == ("1" if flavor == "gpu" else None)
    if flavor == "gpu":  # CPUs and the GPU run out together: 4 CPUs, four replicas of a quarter GPU
        assert float(worker["resources"]["limits"]["cpu"]) / replica_cpus == 1 / share
    else:
        assert share == 0


def test_network_policy_opens_only_the_api_the_metrics_and_the_operator(rendered: Rendered) -> None:
    _, docs, _ = rendered
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "beamserve-ray")
    rules = policy["spec"]["ingress"]
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    opened = sorted(p["port"] for rule in rules for p in rule.get("ports", []))
    assert opened == [8000, 8080, 8265]
    [peers] = [rule["from"] for rule in rules if "ports" not in rule]  # Ray's own traffic: among its pods only
    assert all("namespaceSelector" not in peer for peer in peers)
    # The API from the ingress controller's namespace and from namespaces labelled as its clients.
    [api] = [rule["from"] for rule in rules if rule.get("ports") == [{"port": 8000, "protocol": "TCP"}]]
    assert {"beamserve.io/api-client": "true"} in [peer["namespaceSelector"].get("matchLabels") for peer in api]
    labels = by_kind(docs, "RayService")["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["template"]["metadata"]
    selected = {e["key"]: set(e["values"]) for e in policy["spec"]["podSelector"]["matchExpressions"]}
    assert all(labels["labels"][k] in v for k, v in selected.items())


def test_production_example_adds_gcs_fault_tolerance_and_log_shipping() -> None:
    docs = [d for d in yaml.safe_load_all(run(tool("kubectl"), "kustomize", K8S / "examples" / "production")) if d]
    cluster = by_kind(docs, "RayService")["spec"]["rayClusterConfig"]
    ft = cluster["gcsFaultToleranceOptions"]
    host, port = ft["redisAddress"].split(":")
    store = next(d for d in docs if d["kind"] == "Service" and d["metadata"]["name"] == host)
    assert store["spec"]["ports"][0]["port"] == int(port)
    ref = ft["redisPassword"]["valueFrom"]["secretKeyRef"]
    secret = next(d for d in docs if d["kind"] == "Secret" and d["metadata"]["name"] == ref["name"])
    assert ref["key"] in secret["stringData"]
    store_pod = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == host)
    assert "--appendonly" in store_pod["spec"]["template"]["spec"]["containers"][0]["args"]
    assert store_pod["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"] == "gcs-store"
    # Logs: a Fluent Bit sidecar beside each Ray container, both on the same /tmp/ray, tailing Serve's files.
    config = yaml.safe_load(next(d for d in docs if d["kind"] == "ConfigMap")["data"]["fluent-bit.yaml"])
    [tail] = config["pipeline"]["inputs"]
    assert tail["path"].startswith("/tmp/ray/session_latest/logs/serve/") and tail["parser"] == "json"
    for group in (cluster["headGroupSpec"], *cluster["workerGroupSpecs"]):
        ray, sidecar = group["template"]["spec"]["containers"]
        assert sidecar["name"] == "fluent-bit"
        for c in (ray, sidecar):
            assert any(m["name"] == "ray-logs" and m["mountPath"] == "/tmp/ray" for m in c["volumeMounts"])


def test_production_example_puts_gpu_workers_on_tainted_gpu_nodes_and_mounts_the_models() -> None:
    docs = [d for d in yaml.safe_load_all(run(tool("kubectl"), "kustomize", K8S / "examples" / "production")) if d]
    cluster = by_kind(docs, "RayService")["spec"]["rayClusterConfig"]
    head, [workers] = cluster["headGroupSpec"]["template"]["spec"], cluster["workerGroupSpecs"]
    worker = workers["template"]["spec"]
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in worker["tolerations"]
    assert worker["nodeSelector"] == {"nvidia.com/gpu.present": "true"} and "tolerations" not in head
    claim = next(
        d for d in docs if d["kind"] == "PersistentVolumeClaim" and d["metadata"]["name"] == "beamserve-models"
    )
    assert claim["spec"]["accessModes"] == ["ReadOnlyMany"]
    for spec in (head, worker):  # build_app reads the models' names on the head, the replicas load them
        [volume] = [v for v in spec["volumes"] if v["name"] == "models"]
        assert volume["persistentVolumeClaim"] == {"claimName": "beamserve-models", "readOnly": True}
        ray = spec["containers"][0]
        assert {"name": "models", "mountPath": "/models", "readOnly": True} in ray["volumeMounts"]


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
    assert notes["proxy-body-size"] == "30m" and max(settings.max_body_bytes, settings.max_document_bytes) <= 30 * 2**20
    assert ingress["spec"]["tls"] and ingress["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"] == {
        "name": "beamserve",
        "port": {"number": 8000},
    }


def test_gateway_api_example_is_valid_and_agrees_with_the_server_limits() -> None:
    import jsonschema

    from service.settings import Settings

    schema = json.loads((K8S / "schemas" / "gateway-api.schema.json").read_text())
    docs = list(yaml.safe_load_all((K8S / "examples" / "gateway-api.yaml").read_text()))
    for doc in docs:
        assert not [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(doc)], doc["kind"]
    gateway, route = by_kind(docs, "Gateway"), by_kind(docs, "HTTPRoute")
    [listener] = gateway["spec"]["listeners"]
    assert listener["protocol"] == "HTTPS" and listener["tls"]["certificateRefs"]
    assert route["spec"]["parentRefs"] == [{"name": gateway["metadata"]["name"], "sectionName": listener["name"]}]
    assert route["spec"]["hostnames"] == [listener["hostname"]]
    [rule] = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"name": "beamserve", "port": Settings().port}]
    assert float(rule["timeouts"]["request"].removesuffix("s")) > Settings().request_timeout_s
    # The schema holds the API's names and types: a misspelt field or a wrong enum is refused.
    typo = {**route, "spec": {**route["spec"], "rules": [{**rule, "backendRef": rule["backendRefs"]}]}}
    wrong = {
        **route,
        "spec": {**route["spec"], "rules": [{**rule, "matches": [{"path": {"type": "Prefix", "value": "/"}}]}]},
    }
    for bad in (typo, wrong):
        assert list(jsonschema.Draft7Validator(schema).iter_errors(bad))


def test_api_keys_example_mounts_the_keys_file_everywhere_and_counts_in_its_store(tmp_path: Path) -> None:
    from service.api.keys import KeyLimits, load_keys

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
