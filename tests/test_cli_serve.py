"""`beamserve serve`: starts Ray and the app on 127.0.0.1, says where it listens, stops cleanly on SIGTERM."""

import os
import signal
import subprocess
import sys
import time

import httpx

from .conftest import REPO, free_port


def test_serve_command_listens_translates_and_stops_on_sigterm() -> None:
    port = free_port()
    env = {**os.environ, "BEAMSERVE_MODELS": "en-de", "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--metrics-port", str(free_port()),
         "--num-cpus", "2"], cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # printed once the app is deployed
        assert f"listening on http://127.0.0.1:{port}" in line, line
        deadline = time.monotonic() + 60
        while httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=10).status_code != 200:
            assert time.monotonic() < deadline, "not ready within 60s"
            time.sleep(0.5)
        r = httpx.post(f"http://127.0.0.1:{port}/v1/translate",
                       json={"texts": ["A dog."], "source": "en", "target": "de"}, timeout=30)
        assert r.status_code == 200 and "Hund" in r.json()["translations"][0]["text"]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
