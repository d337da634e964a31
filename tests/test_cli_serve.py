"""`beamserve serve` as the serving install runs it: the image's steps without Docker (the wheel with its C
kernels, deploy/requirements.lock by its hashes, torch, the wheel) in a fresh virtual environment that holds
no test or benchmark tool; from there a model downloaded by its hub id (from a hub the test serves on
127.0.0.1) serves offline with a Ray instance of its own on 127.0.0.1, translates as transformers'
`generate`, opens nothing another host can reach, says where it listens, and stops cleanly on SIGTERM."""

import concurrent.futures
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from packaging.requirements import Requirement

from model.io import checkpoint
from model.shipped import PRETRAINED_DIR
from service.settings import Settings

from .conftest import REPO, free_port, one_ray_start_at_a_time, readyz
from .hub import COMMIT, local_hub

PARAGRAPH = [
    "A group of young men in colorful uniforms are playing a game of soccer on a large green field.",
    "A woman in a red dress is singing on a stage while a band plays behind her.",
    "Two dogs are running through the snow in a park near a frozen lake.",
    "An old man with a white beard is reading a newspaper on a wooden bench.",
]

pytestmark = pytest.mark.slow  # starts Ray, a server, worker processes or training


def listening(root: int) -> list[tuple[str, str, int]]:
    """(process name, address, port) of every TCP socket listening in the process tree under root."""
    procs = [psutil.Process(root), *psutil.Process(root).children(recursive=True)]
    found = []
    for p in procs:
        try:
            found += [
                (p.name(), c.laddr.ip, c.laddr.port)
                for c in p.net_connections(kind="inet")
                if c.status == psutil.CONN_LISTEN
            ]
        except psutil.NoSuchProcess:
            continue
    return found


def is_loopback(ip: str) -> bool:
    address = ipaddress.ip_address(ip)
    mapped = getattr(address, "ipv4_mapped", None)  # [::ffff:127.0.0.1]
    return (mapped or address).is_loopback


REPO_ID = "beamserve-test/opus-mt-en-de"


# The installed environment's processes write bytecode as they import (where PYTHONDONTWRITEBYTECODE is set, each
# of Ray's workers would compile Ray's and torch's sources again), so the install compiles none up front.
WRITES_BYTECODE = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def step(args: list[str | Path], env: dict[str, str] = WRITES_BYTECODE) -> None:
    """One step of the install; its output where it fails."""
    done = subprocess.run([str(a) for a in args], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{args}: {done.stdout[-2000:]}{done.stderr[-3000:]}"


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin directory of a fresh virtual environment holding the serving install, made by the Dockerfile's
    steps: the wheel built from what the image copies, with the C kernels or not at all; every dependency
    but torch from deploy/requirements.lock by its hashes, unresolved (uv, which applies pip's
    --require-hashes --no-deps as pip does, from its cache); torch 2.13.0's CPU build by pip (the image: from
    the index of its flavour); the wheel without its dependencies. Then nothing is missing (pip check) and no test or
    benchmark tool is there."""
    tmp = tmp_path_factory.mktemp("install")
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    for name in ("model", "service"):
        shutil.copytree(REPO / name, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.so"))
    wheels = tmp / "wheels"
    kernels = {**WRITES_BYTECODE, "BEAMSERVE_REQUIRE_KERNELS": "1"}
    step([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", wheels, source], kernels)
    (wheel,) = wheels.glob("*.whl")
    assert any(n.startswith("model/kernels/_native") for n in zipfile.ZipFile(wheel).namelist())
    venv = tmp / "venv"
    python = venv / "bin" / "python"
    step([sys.executable, "-m", "venv", "--without-pip", venv])  # this pip installs into it (--python)
    uv = Path(sys.executable).parent / "uv"
    lock = REPO / "deploy" / "requirements.lock"
    step([uv, "pip", "install", "-q", "--python", python, "--require-hashes", "--no-deps", "-r", lock])
    # torch as `make serve` installs it: a wheel pip finds without an index, else the PyTorch CPU index.
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-compile"]
    local = subprocess.run([*pip, "--no-index", "--no-deps", "torch==2.13.0"], env=WRITES_BYTECODE, capture_output=True)
    cpu_index = [] if local.returncode == 0 else ["--index-url", "https://download.pytorch.org/whl/cpu"]
    step([*pip, "torch==2.13.0", *cpu_index])
    step([*pip, "--no-deps", wheel])
    step([sys.executable, "-m", "pip", "--python", python, "check"])
    listed = "import importlib.metadata as m; print('\\n'.join(d.metadata['Name'] for d in m.distributions()))"
    there = subprocess.run([python, "-c", listed], capture_output=True, text=True, check=True).stdout.split()
    # The development extra's tools, those serving does not need itself (the lock names what it needs).
    pinned = {line.split("==")[0].lower() for line in lock.read_text().splitlines() if "==" in line[:60]}
    dev = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dev"]
    tools = {Requirement(s).name.lower() for s in dev} - pinned - {"beamserve"}
    assert {"transformers", "pytest", "locust", "ctranslate2"} <= tools
    assert not {n.lower() for n in there} & tools, sorted({n.lower() for n in there} & tools)
    return venv / "bin"


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, Path]]:
    """(the hub's address, the directory it serves as REPO_ID): the shipped en-de as transformers saves a
    MarianMT model, with a model card naming its licence, as OPUS-MT's do."""
    model = tmp_path_factory.mktemp("hub") / "opus-mt-en-de"
    checkpoint.export_hf(PRETRAINED_DIR / "en-de", model)
    (model / "README.md").write_text("---\nlicense: cc-by-4.0\ntags:\n- translation\n---\n# opus-mt-en-de\n")
    with local_hub(model, REPO_ID) as url:
        yield url, model


def generate(model: Path, texts: list[str]) -> list[str]:
    """transformers' `generate` on this directory with its own defaults (its generation_config.json)."""
    import torch
    import transformers

    marian = transformers.MarianMTModel.from_pretrained(model).eval()
    tokenizer = transformers.MarianTokenizer.from_pretrained(model)
    with torch.inference_mode():
        out = marian.generate(**tokenizer(texts, return_tensors="pt", padding=True))
    return tokenizer.batch_decode(out, skip_special_tokens=True)


def healthcheck(bin_dir: Path, port: int) -> subprocess.CompletedProcess[str]:
    """`beamserve healthcheck` as the image's HEALTHCHECK runs it, the port given in the environment."""
    env = {**WRITES_BYTECODE, "BEAMSERVE_PORT": str(port), "BEAMSERVE_HOST": "0.0.0.0"}
    return subprocess.run([bin_dir / "beamserve", "healthcheck"], env=env, capture_output=True, text=True)


def held(port: int) -> socket.socket | None:
    """A socket listening on 127.0.0.1:port, as another server's would; None where one already does."""
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        return None
    s.listen()
    return s


def test_a_port_in_use_that_was_named_is_one_line_and_exit_2() -> None:
    with socket.socket() as other:
        other.bind(("127.0.0.1", 0))
        other.listen()
        port = other.getsockname()[1]
        for flags, named in ((["--port", str(port)], "--port"), (["--metrics-port", str(port)], "--metrics-port")):
            if named == "--metrics-port":
                flags += ["--port", str(free_port())]
            r = subprocess.run(
                [sys.executable, "-m", "service.cli", "serve", *flags], cwd=REPO, capture_output=True, text=True
            )
            assert r.returncode == 2, r.stderr[-2000:]
            last = r.stderr.strip().splitlines()[-1]
            assert f"{port} on 127.0.0.1 is in use ({named}" in last and "Traceback" not in r.stderr, r.stderr


def test_the_serving_install_serves_a_downloaded_model_offline_and_stops_on_sigterm(
    installed: Path, hub: tuple[str, Path], tmp_path: Path, sources: list[str]
) -> None:
    hub_url, model = hub
    # Outside the repository, so nothing of the checkout is on the path: only what the install put there.
    cache = {"HF_HOME": str(tmp_path / "hf"), "HF_HUB_DISABLE_TELEMETRY": "1"}
    fetched = subprocess.run(
        [installed / "beamserve", "download", REPO_ID],
        cwd=tmp_path,
        env={**WRITES_BYTECODE, **cache, "HF_ENDPOINT": hub_url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert fetched.returncode == 0, fetched.stderr[-2000:]
    port = free_port()
    # Another server on this host has the default metrics port (8080): this one takes a free one and says it.
    other = held(Settings().metrics_port)
    # Offline, the hub unreachable: the model comes from the cache the download filled.
    env = {**WRITES_BYTECODE, **cache, "HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"}
    # The 12 paragraphs below are all to be accepted however slow this host decodes: no time-based refusal.
    env |= {"BEAMSERVE_MODELS": REPO_ID, "BEAMSERVE_MAX_QUEUE_WAIT_S": "3600", "PYTHONUNBUFFERED": "1"}
    # Another cluster's address, as a Ray node's environment holds it (where ray.init would join it and
    # refuse --num-cpus): serve starts an instance of its own all the same.
    env["RAY_ADDRESS"] = f"127.0.0.1:{free_port()}"
    with one_ray_start_at_a_time():
        proc = subprocess.Popen(
            [installed / "beamserve", "serve", "--port", str(port), "--num-cpus", "2"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=(stderr := open(tmp_path / "stderr.txt", "w")),  # noqa: SIM115 (the server's, closed below)
            text=True,
        )
        stderr.close()  # the server holds its own copy
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once the app is deployed
    try:
        assert f"listening on http://127.0.0.1:{port}" in line, line + (tmp_path / "stderr.txt").read_text()[-3000:]
        metrics_port = int(line.split("/metrics")[0].rsplit(":", 1)[1])  # "Prometheus metrics on http://...:N/metrics"
        assert metrics_port != Settings().metrics_port
        assert (
            f"metrics port {Settings().metrics_port} is in use; metrics on {metrics_port}"
            in (tmp_path / "stderr.txt").read_text()
        )
        deadline = time.monotonic() + 60
        while (r := readyz(f"http://127.0.0.1:{port}")) is None or r.status_code != 200:
            assert time.monotonic() < deadline, "not ready within 60s"
            time.sleep(0.5)
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/translate",
            json={"texts": sources[:6], "source": "en", "target": "de"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
        assert [t["text"] for t in r.json()["translations"]] == generate(model, sources[:6])
        (info,) = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10).json()["models"]
        assert info["revision"] == COMMIT and info["license"] == "cc-by-4.0", info
        assert not info["kernels"].startswith("none"), info  # the wheel's C kernels load
        assert healthcheck(installed, port).returncode == 0  # the Docker image's HEALTHCHECK, on the configured port
        # The model's replica at the server's own priority, not Ray's default nice 15 for its workers.
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
        replicas = [p for p in tree if "ServeReplica" in " ".join(p.cmdline() or [p.name()])]
        assert replicas and {p.nice() for p in replicas} == {psutil.Process(proc.pid).nice()}
        # Ray's GCS, raylet, workers, agents, Serve's replicas and the metrics exporter: loopback only.
        sockets = listening(proc.pid)
        assert {"gcs_server", "raylet"} <= {name for name, _, _ in sockets}, sockets
        exposed = [s for s in sockets if not is_loopback(s[1])]
        assert not exposed, f"listening beyond loopback: {exposed}"
        assert ("127.0.0.1", metrics_port) in {(ip, p) for _, ip, p in sockets}
        assert "ray_" in httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10).text
        # SIGTERM under load: what was accepted is answered, what comes after is refused, then it exits.
        url = f"http://127.0.0.1:{port}"
        with concurrent.futures.ThreadPoolExecutor(12) as pool:
            accepted = [
                pool.submit(
                    httpx.post,
                    f"{url}/v1/translate",
                    json={"texts": PARAGRAPH, "source": "en", "target": "de"},
                    timeout=60,
                )
                for _ in range(12)
            ]
            while httpx.get(f"{url}/v1/stats", timeout=10).json()["en-de"]["active"] == 0:
                assert not all(f.done() for f in accepted), "answered before any was seen in progress"
                time.sleep(0.02)
            proc.send_signal(signal.SIGTERM)
            proc.send_signal(signal.SIGTERM)  # twice, as an impatient operator or a supervisor and a shell do
            deadline = time.monotonic() + 10
            while httpx.get(f"{url}/readyz", timeout=10).status_code != 503:  # drained: out of rotation at once
                assert time.monotonic() < deadline, "/readyz still 200 after SIGTERM"
                time.sleep(0.05)
            late = httpx.post(f"{url}/v1/translate", json={"texts": ["A dog."], "source": "en", "target": "de"})
            assert late.status_code == 503 and late.json()["error"] == "shutting_down"
            assert late.headers["retry-after"] == "5"
            answers = [f.result() for f in accepted]
        assert [r.status_code for r in answers] == [200] * 12, [r.text[:200] for r in answers if r.status_code != 200]
        assert all(len(r.json()["translations"]) == len(PARAGRAPH) for r in answers)
        assert proc.wait(timeout=90) == 0
        gone = healthcheck(installed, port)
        assert gone.returncode == 1 and f"http://127.0.0.1:{port}/healthz" in gone.stderr, gone.stderr
    finally:
        if other is not None:
            other.close()
        if proc.poll() is None:
            proc.kill()
