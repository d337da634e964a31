"""The framework's floor for the serving benchmark: a bare Ray Serve FastAPI deployment that answers
each POST with its body, started like `beamserve serve` (local Ray, Serve's HTTP entry on loopback).

    python loadtests/serving_echo.py --port 8123

Ray Serve's proxy mode comes from the environment (RAY_SERVE_ENABLE_HA_PROXY, ...), as for beamserve.
"""

# No `from __future__ import annotations`: FastAPI must see the real Request type.
import argparse
import os
import signal
import threading

from fastapi import FastAPI, Request, Response
from ray import serve

app = FastAPI()


@serve.deployment(ray_actor_options={"num_cpus": 0})
@serve.ingress(app)
class Echo:
    @app.post("/echo")
    async def echo(self, request: Request) -> Response:
        return Response(await request.body(), media_type="application/json")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")  # every Ray port on loopback
    import ray

    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING")
    serve.start(http_options={"host": "127.0.0.1", "port": args.port})
    serve.run(Echo.bind(), name="echo", route_prefix="/")
    print("echo listening", flush=True)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stop.wait()
    serve.shutdown()
    ray.shutdown()


if __name__ == "__main__":
    main()
