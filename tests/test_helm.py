"""The Helm chart (deploy/k8s/Chart.yaml): its objects, for the release beamserve, are what the kustomize
tree beside it renders (compared here, the release's label aside); two releases share a namespace; the
front's limits are one value; values that would not run are refused with the value named. test_k8s.py
validates its renders beside the overlays'."""

from __future__ import annotations

import json
import subprocess
import tarfile
from pathlib import Path
from typing import Any

import pytest
import yaml

from .test_k8s import K8S, by_kind, render, run, tool

HELM_LABELS = {"app.kubernetes.io/managed-by", "app.kubernetes.io/instance", "helm.sh/chart"}


def without_release(node: Any) -> Any:
    """node without the release's label wherever it selects (matchLabels, selectors, pod labels, label
    expressions): the chart's objects of one release select only its own pods; kustomize's tree is one."""
    if isinstance(node, dict):
        return {k: without_release(v) for k, v in node.items() if k != "app.kubernetes.io/instance"}
    if isinstance(node, list):
        return [without_release(v) for v in node if not (isinstance(v, dict) and v.get("key") == INSTANCE)]
    return node


INSTANCE = "app.kubernetes.io/instance"


def comparable(text: str) -> dict[tuple[str, str], dict[str, Any]]:
    """Objects by (kind, name), without the labels the chart adds, the Serve config and a keys file
    parsed (their text is formatting)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for doc in yaml.safe_load_all(text):
        if not doc:
            continue
        labels = {k: v for k, v in doc["metadata"].get("labels", {}).items() if k not in HELM_LABELS}
        labels.pop("app.kubernetes.io/part-of", None)  # on every chart object; kustomize's base only
        doc = without_release(doc)
        doc["metadata"]["labels"] = labels
        if doc["kind"] == "RayService":
            doc["spec"]["serveConfigV2"] = yaml.safe_load(doc["spec"]["serveConfigV2"])
        if doc["kind"] == "Secret" and "keys.json" in doc.get("stringData", {}):
            doc["stringData"]["keys.json"] = json.loads(doc["stringData"]["keys.json"])
        out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


@pytest.mark.parametrize(
    ("values", "kustomization", "extra"),
    [("cpu", "overlays/cpu", []), ("production", "examples/production", ["examples/ingress-nginx.yaml"])],
)
def test_the_chart_renders_what_kustomize_renders(values: str, kustomization: str, extra: list[str]) -> None:
    chart = comparable(render(f"helm/{values}"))
    want = comparable(render(kustomization) + "".join("\n---\n" + (K8S / f).read_text() for f in extra))
    assert chart.keys() == want.keys()
    for key, obj in want.items():
        assert chart[key] == obj, key
    labels = by_kind(list(yaml.safe_load_all(render(f"helm/{values}"))), "RayService")["metadata"]["labels"]
    assert labels["app.kubernetes.io/managed-by"] == "Helm" and labels["app.kubernetes.io/instance"] == "beamserve"


def test_the_default_values_render_the_cpu_overlay_without_the_podmonitor() -> None:
    out = subprocess.run([tool("helm"), "template", "beamserve", str(K8S)], capture_output=True, text=True)
    assert out.returncode == 0 and not out.stderr, out.stderr
    want = comparable(render("overlays/cpu"))
    del want[("PodMonitor", "beamserve")]  # the Prometheus Operator's CRDs are not everywhere
    assert comparable(out.stdout) == want


def test_the_chart_passes_helm_lint_strict_with_each_values_file() -> None:
    for values in sorted((K8S / "ci").glob("*-values.yaml")):
        out = run(tool("helm"), "lint", "--strict", K8S, "-f", values)
        assert "1 chart(s) linted, 0 chart(s) failed" in out, values.name


def test_registry_values_deploy_each_model_copy_the_models_in_and_use_the_users_secrets() -> None:
    from ray.serve.schema import ServeDeploySchema

    from service.settings import Settings

    values = yaml.safe_load((K8S / "ci" / "registry-values.yaml").read_text())
    docs = [d for d in yaml.safe_load_all(render("helm/registry")) if d]
    spec = by_kind(docs, "RayService")["spec"]
    app = ServeDeploySchema.model_validate(yaml.safe_load(spec["serveConfigV2"])).applications[0]
    # The registry replaces the shipped models; each entry outside the pool is a deployment with the
    # shipped models' options and the values' over them; the args the values set, over the tree's.
    assert "models" not in app.args and app.args["compute_type"] == "int8" and app.args["replica_cpus"] == 1
    entries = Settings(**app.args).entries()
    assert [e.name for e in entries] == [e["name"] for e in values["models"]["registry"]]
    by_name = {d.name: d for d in app.deployments}
    assert sorted(by_name) == sorted(["Gateway"] + [f"model-{e.name}" for e in entries if not e.pool])
    for e in entries:
        if not e.pool:
            d = by_name[f"model-{e.name}"]
            assert d.autoscaling_config == values["models"]["deployment"]["autoscaling_config"]
            assert d.max_replicas_per_node == 2 and d.graceful_shutdown_timeout_s == 60
    cluster = spec["rayClusterConfig"]
    for pod in (cluster["headGroupSpec"]["template"]["spec"], cluster["workerGroupSpecs"][0]["template"]["spec"]):
        # The models copied out of the image into an emptyDir the Ray container reads at /models.
        [copy] = pod["initContainers"]
        assert copy["image"] == values["models"]["copyFrom"]["image"]
        [target] = copy["volumeMounts"]
        assert copy["command"][-1] == f"cp -R /models/. {target['mountPath']}/" and target["mountPath"] != "/models"
        [volume] = [v for v in pod["volumes"] if v["name"] == target["name"]]
        assert "emptyDir" in volume
        mounts = pod["containers"][0]["volumeMounts"]
        assert {"name": target["name"], "mountPath": "/models", "readOnly": True} in mounts
        # The user's keys Secret, mounted where the setting says.
        [keys] = [v for v in pod["volumes"] if v["name"] == "api-keys"]
        assert keys["secret"]["secretName"] == "translation-keys"
    head_env = {e["name"]: e.get("value") for e in cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
    assert head_env["BEAMSERVE_LIMITS_STORAGE"] == "redis://redis.cache.svc:6379/3"
    assert head_env["BEAMSERVE_RECORDS_STORAGE"] == "rediss://records.cache.svc:6380/0"
    assert (
        cluster["gcsFaultToleranceOptions"]["redisPassword"]["valueFrom"]["secretKeyRef"]["name"] == "ray-gcs-password"
    )
    store = next(d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "beamserve-gcs-store")
    [password] = store["spec"]["template"]["spec"]["containers"][0]["env"]
    assert password["valueFrom"]["secretKeyRef"]["name"] == "ray-gcs-password"
    # Neither Secret made (the user's exist), nor the limits or records Valkey (the user's Redis count and keep).
    made = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert not [k for k in made if k[0] == "Secret"] and ("Deployment", "beamserve-limits") not in made
    assert not [k for k in made if k[1] == "beamserve-records"]
    assert cluster["workerGroupSpecs"][0]["maxReplicas"] == 6
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "beamserve-ray")
    peers = {
        port["port"]: [p["namespaceSelector"]["matchLabels"] for p in rule["from"]]
        for rule in policy["spec"]["ingress"]
        for port in rule.get("ports", [])
        if port["port"] in (8000, 8080)
    }
    names = "kubernetes.io/metadata.name"
    assert peers[8000] == [{names: n} for n in ("ingress-nginx", "traefik", "mastodon")] + [
        {"beamserve.io/api-client": "true"}
    ]
    assert peers[8080] == [{names: "monitoring"}, {names: "observability"}]


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--set", "apiKey.enabled=true"], "Additional property apiKey is not allowed"),
        (["--set", "apiKeys.enabled=true"], "set apiKeys.keys"),
        (["--set", "gcsFaultTolerance.enabled=true"], "set gcsFaultTolerance.password"),
        (["--set", "models.volume.enabled=true", "--set", "models.copyFrom.image=m:1"], "volume.enabled or copyFrom"),
        (["--set", "workers.minReplicas=5"], "workers.minReplicas is above workers.maxReplicas"),
        (["--set", "ingress.enabled=true"], "set ingress.host"),
        (["--set", "httpRoute.enabled=true"], "set httpRoute.parentRefs"),
        (["--set", "records.storage=cache:6379"], "records"),
        (["--set-json", "networkPolicy.monitoringNamespaces=[]"], "networkPolicy: name at least one namespace"),
        (["--set", "models.registry[0].name=en-de"], "models.registry.0: path is required"),
        (["--set", "apiKeys.limitsStorage=cache:6379"], "limitsStorage"),
        (["--set", "serve.args.models=/models/opus-mt-de-en"], "name the models in models.registry"),
    ],
)
def test_the_chart_refuses_values_that_would_not_run(options: list[str], message: str) -> None:
    proc = subprocess.run(
        [tool("helm"), "template", "beamserve", str(K8S), *options], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr


def test_the_packaged_chart_is_its_templates_and_values_and_renders_the_same(tmp_path: Path) -> None:
    run(tool("helm"), "package", K8S, "--destination", tmp_path)
    [package] = tmp_path.glob("beamserve-*.tgz")
    with tarfile.open(package) as tar:
        names = {n.removeprefix("beamserve/") for n in tar.getnames()}
    assert {"Chart.yaml", "values.yaml", "values.schema.json", "templates/rayservice.yaml"} <= names
    assert not {n for n in names if n.startswith(("base/", "overlays/", "components/", "examples/", "ci/", "schemas/"))}
    values = K8S / "ci" / "production-values.yaml"
    packaged = run(tool("helm"), "template", "beamserve", package, "-f", values)
    assert comparable(packaged) == comparable(render("helm/production"))


def test_two_releases_in_one_namespace_name_and_select_only_their_own() -> None:
    values = K8S / "ci" / "production-values.yaml"
    docs = {
        release: [d for d in yaml.safe_load_all(run(tool("helm"), "template", release, K8S, "-f", values)) if d]
        for release in ("beamserve", "translate")
    }
    names = {r: {(d["kind"], d["metadata"]["name"]) for d in found} for r, found in docs.items()}
    assert not names["beamserve"] & names["translate"]
    assert ("RayService", "translate-beamserve") in names["translate"]
    for release, found in docs.items():
        pdb = by_kind(found, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]
        assert pdb[INSTANCE] == release
        cluster = by_kind(found, "RayService")["spec"]["rayClusterConfig"]
        worker = cluster["workerGroupSpecs"][0]["template"]
        assert worker["metadata"]["labels"][INSTANCE] == release  # what the PDB and the policies select
        head_env = {e["name"]: e["value"] for e in cluster["headGroupSpec"]["template"]["spec"]["containers"][0]["env"]}
        prefix = "beamserve" if release == "beamserve" else "translate-beamserve"
        assert head_env["BEAMSERVE_LIMITS_STORAGE"] == f"redis://{prefix}-limits:6379/0"
        assert head_env["BEAMSERVE_RECORDS_STORAGE"] == f"redis://{prefix}-records:6379/0"
        assert head_env["BEAMSERVE_PUBLIC_URL"] == "https://translate.example.com"  # the Ingress's host: links


def test_the_gateways_the_chart_scales_share_the_records_store_it_deploys() -> None:
    """The Gateway autoscales over worker pods, whose files are their own: glossaries and documents go to the
    records Valkey (an append-only file on a volume, memory bounded without eviction), which only Ray pods reach."""
    from ray.serve.schema import ServeDeploySchema

    docs = [d for d in yaml.safe_load_all(run(tool("helm"), "template", "beamserve", K8S)) if d]
    spec = by_kind(docs, "RayService")["spec"]
    app = ServeDeploySchema.model_validate(yaml.safe_load(spec["serveConfigV2"])).applications[0]
    [gateway] = [d for d in app.deployments if d.name == "Gateway"]
    assert gateway.autoscaling_config["max_replicas"] > 1  # why the store must be shared
    head = spec["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert {"name": "BEAMSERVE_RECORDS_STORAGE", "value": "redis://beamserve-records:6379/0"} in head["env"]
    named = {(d["kind"], d["metadata"]["name"]): d for d in docs}
    service = named["Service", "beamserve-records"]["spec"]
    store = named["Deployment", "beamserve-records"]["spec"]["template"]["spec"]
    assert service["ports"] == [{"port": 6379, "targetPort": "valkey", "name": "valkey"}]
    pod_labels = named["Deployment", "beamserve-records"]["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= pod_labels.items()
    args = store["containers"][0]["args"]
    assert args[args.index("--appendonly") + 1] == "yes" and args[args.index("--maxmemory-policy") + 1] == "noeviction"
    assert store["volumes"] == [{"name": "data", "persistentVolumeClaim": {"claimName": "beamserve-records"}}]
    assert ("PersistentVolumeClaim", "beamserve-records") in named
    stores = named["NetworkPolicy", "beamserve-stores"]["spec"]["podSelector"]["matchExpressions"]
    assert {
        "key": "app.kubernetes.io/component",
        "operator": "In",
        "values": ["records", "limits", "gcs-store"],
    } in stores


def test_the_front_s_limits_are_one_value_in_the_serve_config_and_every_pod_and_env_reaches_every_pod() -> None:
    from service.api.front import Limits, cluster_environment

    out = subprocess.run(
        [
            tool("helm"),
            "template",
            "beamserve",
            str(K8S),
            "--set",
            "front.maxInFlight=100",
            "--set-json",
            "front.requestTimeoutS=7.5",
            "--set-json",
            'env=[{"name": "BEAMSERVE_LOG_LEVEL", "value": "DEBUG"}]',
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    spec = by_kind([d for d in yaml.safe_load_all(out.stdout) if d], "RayService")["spec"]
    args = yaml.safe_load(spec["serveConfigV2"])["applications"][0]["args"]
    assert (args["max_in_flight"], args["request_timeout_s"], args["max_queued"]) == (100, 7.5, 64)
    want = cluster_environment(Limits(100, 64, 1_000_000, 30_000_000, 10.0, 7.5))
    cluster = spec["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]["template"]["spec"], cluster["workerGroupSpecs"][0]["template"]["spec"]]
    for pod in pods:
        env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
        assert {k: env.get(k) for k in want} == want
        assert env["BEAMSERVE_LOG_LEVEL"] == "DEBUG"


def test_an_httproute_goes_through_the_users_gateway_to_the_release_s_service_within_the_server_s_timeout() -> None:
    import jsonschema

    from service.settings import Settings

    options = [
        "--set",
        "httpRoute.enabled=true",
        "--set-json",
        'httpRoute.parentRefs=[{"name": "public", "namespace": "gw"}]',
    ]
    options += ["--set-json", 'httpRoute.hostnames=["translate.example.com"]', "--set", "front.requestTimeoutS=50"]
    docs = [d for d in yaml.safe_load_all(run(tool("helm"), "template", "translate", K8S, *options)) if d]
    route = by_kind(docs, "HTTPRoute")
    schema = json.loads((K8S / "schemas" / "gateway-api.schema.json").read_text())
    assert not [e.message for e in jsonschema.Draft7Validator(schema).iter_errors(route)]
    assert route["spec"]["parentRefs"] == [{"name": "public", "namespace": "gw"}]
    [rule] = route["spec"]["rules"]
    assert rule["backendRefs"] == [{"name": "translate-beamserve", "port": Settings().port}]
    assert rule["timeouts"]["request"] == "65s"  # past the server's 50 s: its JSON 504 comes first
    assert "HTTPRoute" not in {d["kind"] for d in yaml.safe_load_all(run(tool("helm"), "template", "b", K8S)) if d}
