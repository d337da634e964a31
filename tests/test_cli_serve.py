"""`beamserve serve`: starts a Ray instance of its own and the app on 127.0.0.1, opens nothing another host
can reach, says where it listens, stops cleanly on SIGTERM."""

import concurrent.futures
import ipaddress
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from service.settings import Settings

from .conftest import REPO, free_port, one_ray_start_at_a_time, readyz

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


def healthcheck(port: int) -> subprocess.CompletedProcess[str]:
    """`beamserve healthcheck` with the port given as the image gives it, in the environment."""
    env = {**os.environ, "BEAMSERVE_PORT": str(port), "BEAMSERVE_HOST": "0.0.0.0"}
    return subprocess.run(
        [sys.executable, "-m", "service.cli", "healthcheck"], cwd=REPO, env=env, capture_output=True, text=True
    )


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


def test_serve_command_listens_translates_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    # Another server on this host has the default metrics port (8080): this one takes a free one and says it.
    other = held(Settings().metrics_port)
    # The 12 paragraphs below are all to be accepted however slow this host decodes: no time-based refusal.
    env = {**os.environ, "BEAMSERVE_MODELS": "en-de", "BEAMSERVE_MAX_QUEUE_WAIT_S": "3600", "PYTHONUNBUFFERED": "1"}
    # Another cluster's address, as a Ray node's environment holds it (where ray.init would join it and
    # refuse --num-cpus): serve starts an instance of its own all the same.
    env["RAY_ADDRESS"] = f"127.0.0.1:{free_port()}"
    with one_ray_start_at_a_time():
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "service.cli",
                "serve",
                "--port",
                str(port),
                "--num-cpus",
                "2",
            ],
            cwd=REPO,
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
            json={"texts": ["A dog."], "source": "en", "target": "de"},
            timeout=30,
        )
        assert r.status_code == 200 and "Hund" in r.json()["translations"][0]["text"]
        assert healthcheck(port).returncode == 0  # the Docker image's HEALTHCHECK, on the configured port
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
        gone = healthcheck(port)
        assert gone.returncode == 1 and f"http://127.0.0.1:{port}/healthz" in gone.stderr, gone.stderr
    finally:
        if other is not None:
            other.close()
        if proc.poll() is None:
            proc.kill()
