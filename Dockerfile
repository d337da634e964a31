# beamserve image on Ray's own image, so the same image runs `beamserve serve` standalone and the
# KubeRay head/worker pods (deploy/k8s).
#   docker build -t beamserve:gpu .                                   # CUDA (default)
#   docker build -t beamserve:cpu --build-arg FLAVOR=cpu --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cpu .
ARG RAY_VERSION=2.60.0
ARG FLAVOR=gpu
FROM rayproject/ray:${RAY_VERSION}-py311-${FLAVOR}

# The CUDA build of torch for GPU images (cu128 wheels run on drivers >= 570); the CPU index for FLAVOR=cpu.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128

# jemalloc, which the model replicas preload (BEAMSERVE_ALLOCATOR=auto): under glibc's malloc a
# replica's resident memory creeps with the ever-changing tensor sizes of decoding; under jemalloc it
# levels off (docs/benchmarks.md "Memory"). The distribution's package, its version the base image's.
USER 0
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends libjemalloc2 && rm -rf /var/lib/apt/lists/*

# Ray's image otherwise runs as the non-root user `ray` (uid 1000) with a user-owned Python; numeric
# so Kubernetes' runAsNonRoot can verify it.
USER 1000
WORKDIR /home/ray/beamserve

RUN pip install --no-cache-dir torch==2.13.0 --index-url "${TORCH_INDEX}"

COPY --chown=ray:users pyproject.toml README.md ./
COPY --chown=ray:users model ./model
COPY --chown=ray:users service ./service
COPY --chown=ray:users deploy ./deploy
# ray[serve] is already in the image at RAY_VERSION; this adds beamserve, its shipped models and pins.
# DL3013 asks for pinned versions: this installs the local package, whose dependencies pyproject.toml pins.
# hadolint ignore=DL3013
RUN pip install --no-cache-dir ".[serve]"

# The HTTP API and the metrics (through beamserve's relay) on the container's interfaces; Ray's own
# ports stay on loopback inside the container with its token authentication on (README "Security").
ENV BEAMSERVE_HOST=0.0.0.0 \
    BEAMSERVE_PORT=8000 \
    BEAMSERVE_METRICS_HOST=0.0.0.0 \
    BEAMSERVE_METRICS_PORT=8080 \
    PYTHONUNBUFFERED=1
EXPOSE 8000 8080

HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=4)"]

CMD ["beamserve", "serve"]
