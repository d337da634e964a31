# beamserve image on Ray's own CPU image, so the same image runs `beamserve serve` standalone and the
# KubeRay head/worker pods (deploy/k8s). Both flavours start from the CPU base: the GPU flavour gets
# CUDA once, from torch's CUDA wheels (the NVIDIA driver comes from the host), not a second time from
# a CUDA base image.
#   docker build -t beamserve:cpu .                                    # CPU (default)
#   docker build -t beamserve:gpu --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 .
# BASE names Ray's image by tag; to pin it by digest, resolve it where the registry is reachable and
# pass or write it: --build-arg BASE=rayproject/ray:2.60.0-py311-cpu@sha256:<digest>
# (`docker buildx imagetools inspect rayproject/ray:2.60.0-py311-cpu` prints the digest).
ARG BASE=rayproject/ray:2.60.0-py311-cpu

# Build stage: beamserve's C kernels (setup.py) need a C compiler; the wheel built here carries them,
# and the runtime stage below installs it without one.
FROM ${BASE} AS build
USER 0
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
USER 1000
WORKDIR /home/ray/build
COPY --chown=ray:users pyproject.toml setup.py README.md LICENSE ./
COPY --chown=ray:users model ./model
COPY --chown=ray:users service ./service
# A build without the kernels fails here rather than shipping an image that runs without them.
ENV BEAMSERVE_REQUIRE_KERNELS=1
RUN pip wheel --no-cache-dir --no-deps --no-build-isolation -w /home/ray/wheels . \
 && python -c "import sys, zipfile, glob; n = zipfile.ZipFile(glob.glob('/home/ray/wheels/*.whl')[0]).namelist(); \
sys.exit(0 if any(f.startswith('model/kernels/_native') for f in n) else 'the C kernels did not build')"

FROM ${BASE}

# torch's wheel index: CPU by default; cu128 wheels (drivers >= 570) for GPU images.
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu

# jemalloc, which the model replicas preload (BEAMSERVE_ALLOCATOR=auto): under glibc's malloc a
# replica's resident memory creeps with the ever-changing tensor sizes of decoding; under jemalloc it
# levels off (docs/benchmarks.md "Memory"). No compiler: the kernels come built, in the wheel.
# The distribution's packages, their versions the base image's.
USER 0
# hadolint ignore=DL3008
RUN apt-get update && apt-get install -y --no-install-recommends libjemalloc2 \
 && rm -rf /var/lib/apt/lists/*

# Ray's image otherwise runs as the non-root user `ray` (uid 1000) with a user-owned Python; numeric
# so Kubernetes' runAsNonRoot can verify it.
USER 1000
WORKDIR /home/ray/beamserve

# Every Python dependency but torch at the version and hashes of deploy/requirements.lock (`make lock`);
# ray[serve] is already in the image at the locked version. Then torch from its index, pinned by
# version, with the CUDA libraries its wheel names; then beamserve's wheel from the build stage, with
# no further resolution.
COPY --chown=ray:users deploy/requirements.lock ./deploy/requirements.lock
RUN pip install --no-cache-dir --require-hashes --no-deps -r deploy/requirements.lock \
 && pip install --no-cache-dir torch==2.13.0 --index-url "${TORCH_INDEX}"

COPY --chown=ray:users deploy ./deploy
COPY --from=build /home/ray/wheels /home/ray/wheels
RUN pip install --no-cache-dir --no-deps /home/ray/wheels/*.whl

# The HTTP API and the metrics (through beamserve's relay) on the container's interfaces; Ray's own
# ports stay on loopback inside the container with its token authentication on (README "Security").
ENV BEAMSERVE_HOST=0.0.0.0 \
    BEAMSERVE_PORT=8000 \
    BEAMSERVE_METRICS_HOST=0.0.0.0 \
    BEAMSERVE_METRICS_PORT=8080 \
    PYTHONUNBUFFERED=1
EXPOSE 8000 8080

# On the port the container serves (BEAMSERVE_PORT, set at run time or here).
HEALTHCHECK --interval=30s --timeout=5s --start-period=120s --retries=3 CMD ["beamserve", "healthcheck"]
# SIGTERM drains for up to BEAMSERVE_DRAIN_TIMEOUT_S (40 s) and Ray stops after it: run with
# `docker run --stop-timeout 50` (compose: stop_grace_period: 50s), Docker's default 10 s cuts the drain.
STOPSIGNAL SIGTERM

CMD ["beamserve", "serve"]
