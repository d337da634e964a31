# One-command set-up: every target creates .venv when it is missing.
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(VENV)/bin/pip
DATA ?= ../shared/data/multi30k

.PHONY: lock install chromium clang serve test test-fast lint format gpu-wheels bench-decode bench-gemm bench-batching bench-memory bench-serving bench-latency loadtest faults cluster-faults chaos soak fuzz clean

# torch 2.13.0 from TORCH_INDEX: by default the PyTorch CPU index (PyPI's Linux torch is the CUDA build of several
# GB), where a wheel pip finds without an index (a find-links directory, as the development machines have) comes
# first; `make serve TORCH_INDEX=https://download.pytorch.org/whl/cu128` for the CUDA build.
CPU_INDEX := https://download.pytorch.org/whl/cpu
TORCH_INDEX ?= $(CPU_INDEX)
ifeq ($(TORCH_INDEX),$(CPU_INDEX))
torch_install = { $(PIP) install -q --no-index --no-deps torch==2.13.0 2>/dev/null && $(PIP) install -q torch==2.13.0; } \
  || $(PIP) install -q --index-url $(TORCH_INDEX) torch==2.13.0
else
torch_install = $(PIP) install -q --index-url $(TORCH_INDEX) torch==2.13.0
endif

# install_extra(EXTRA): the virtual environment with beamserve and its EXTRA dependencies.
define install_extra
	test -x $(PY) || python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	# torch first, from its index, so that nothing resolves it from PyPI (the CUDA build).
	$(torch_install)
	@# The rest by uv (its pinned version, as the dev dependencies name it): the versions pip resolves,
	@# installed in a fifth of the time, compiled to bytecode as pip does: where PYTHONDONTWRITEBYTECODE is set
	@# nothing else writes it, and every process, each of Ray's workers among them, would compile Ray's,
	@# FastAPI's and pydantic's sources as it imports them (a `beamserve serve` start: 22 CPU-s against 61,
	@# loadtests/results/start.md).
	$(PIP) install -q $$(grep -o '"uv==[^"]*"' pyproject.toml | tr -d '"')
	$(VENV)/bin/uv pip install -q --compile-bytecode --python $(PY) -e '.[$(1)]'
	@# The C kernels build only where there is a C compiler (setup.py); a quiet install would not say it failed.
	@$(PY) -c "from model.kernels import native; print('beamserve C kernels:', native.in_use())"
endef

# Everything: serving, the tests, the benchmarks and the tools they use.
$(VENV)/.installed: pyproject.toml setup.py $(wildcard model/kernels/csrc/*.c model/kernels/csrc/*.h)
	$(call install_extra,dev)
	touch $@ $(VENV)/.serving

# What serving needs and nothing else (`make serve` on a fresh machine): no test or benchmark tool.
$(VENV)/.serving: pyproject.toml setup.py $(wildcard model/kernels/csrc/*.c model/kernels/csrc/*.h)
	$(call install_extra,serve)
	touch $@

install: $(VENV)/.installed

# promtool (Prometheus' rule checker and rule unit-test runner) for the tests: the binary from Debian's
# prometheus package, unpacked into the virtual environment (nothing installed system-wide, no service).
$(VENV)/bin/promtool: | $(VENV)/.installed
	rm -rf $(VENV)/promdeb && mkdir -p $(VENV)/promdeb
	cd $(VENV)/promdeb && { apt-get download -q prometheus || { apt-get update -q && apt-get download -q prometheus; }; } \
	  2>&1 | tail -1 && dpkg-deb -x prometheus_*.deb root
	cp $(VENV)/promdeb/root/usr/bin/promtool $@
	rm -rf $(VENV)/promdeb

# axe-core (Deque's accessibility checker) for the page's accessibility test (tests/test_page.py): its one
# file from npm, beside the virtual environment's packages; the test injects it into the page.
AXE_VERSION := 4.14.1
$(VENV)/axe/axe.min.js: | $(VENV)/.installed
	rm -rf $(VENV)/axe-npm && mkdir -p $(VENV)/axe
	npm install --silent --no-audit --no-fund --prefix $(VENV)/axe-npm axe-core@$(AXE_VERSION)
	cp $(VENV)/axe-npm/node_modules/axe-core/axe.min.js $@
	rm -rf $(VENV)/axe-npm

# Debian's packages, from the package lists as they are, or after an update where they are missing.
apt_install = { apt-get install -y -q --no-install-recommends $(1) || \
  { apt-get update -q && apt-get install -y -q --no-install-recommends $(1); }; }

# Chromium and its driver for the translation page's browser tests (tests/test_page.py): Debian's
# packages, installed once system-wide (Selenium drives them; nothing is downloaded at test time).
chromium:
	command -v chromium >/dev/null && command -v chromedriver >/dev/null || $(call apt_install,chromium chromium-driver)

# clang for the test that the C kernels build with it and give GCC's build's bits (tests/test_native.py):
# Debian's package, installed once system-wide.
clang:
	command -v clang >/dev/null || $(call apt_install,clang)

serve: $(VENV)/.serving
	$(VENV)/bin/beamserve serve

CODE := model service tests loadtests

# Two pytest-xdist workers, a module's tests in one (its fixtures start once) and the shared server's
# modules in one (tests/conftest.py), OpenMP's threads waiting passively (two workers' thread teams
# spinning on two cores starve each other); then, with nothing beside them, the tests marked `alone`.
TEST_WORKERS ?= 2
# The tests' install builds the C kernels or fails (setup.py): a test run never measures the fallback unnoticed.
test: export BEAMSERVE_REQUIRE_KERNELS = 1
test: lint $(VENV)/bin/promtool $(VENV)/axe/axe.min.js chromium clang
	OMP_WAIT_POLICY=PASSIVE $(PY) -m pytest -q -ra -n $(TEST_WORKERS) -m "not alone"
	$(PY) -m pytest -q -ra -m alone

# The inner loop: everything but the tests that start Ray, a server, worker processes or training.
test-fast: lint $(VENV)/bin/promtool
	$(PY) -m pytest -q -ra -m "not slow"

lint: install
	$(VENV)/bin/ruff check $(CODE)
	$(VENV)/bin/ruff format --check $(CODE)
	$(VENV)/bin/mypy model service

format: install
	$(VENV)/bin/ruff check --fix $(CODE)
	$(VENV)/bin/ruff format $(CODE)

# Wheels the GPU stage (loadtests/gpu_run.sh) needs that the lent GPU machines lack, for their Python,
# at this environment's versions, into .whl/ (about 5 MB) to carry with the call. Not CTranslate2: its
# wheel (41 MB) links CUDA 12's cuBLAS, which those machines' CUDA 13 lacks; `make gpu-wheels
# GPU_EXTRA=ctranslate2` adds it for a CUDA 12 machine.
GPU_PY ?= 3.12
GPU_EXTRA ?=
GPU_WHEELS := $(GPU_EXTRA) pytest pluggy iniconfig packaging pygments pydantic pydantic-core pydantic-settings \
  python-dotenv annotated-types typing-inspection typing-extensions
gpu-wheels: install
	rm -rf .whl
	$(PIP) download -q --no-deps --only-binary=:all: --python-version $(GPU_PY) --platform manylinux_2_28_x86_64 \
	  --platform manylinux2014_x86_64 -d .whl $$($(PY) -c "import importlib.metadata as m, sys; \
	  print(' '.join(f'{n}=={m.version(n)}' for n in sys.argv[1:]))" $(GPU_WHEELS))
	du -sh .whl

bench-decode: install
	BEAMSERVE_DATA=$(DATA) $(PY) loadtests/bench_decode.py --out runs/bench/decode_latest.md

bench-gemm: install
	$(PY) loadtests/bench_gemm.py

bench-batching: install
	BEAMSERVE_DATA=$(DATA) $(PY) loadtests/bench_batching.py --out runs/bench/batching_latest.md

bench-memory: install
	$(PY) loadtests/bench_memory.py --out runs/bench/memory_latest.md

# CPU per request by process, beamserve beside a bare Serve echo, both HTTP fronts, and a flood.
bench-serving: install
	BEAMSERVE_DATA=$(DATA) $(PY) loadtests/bench_serving.py --out runs/bench/serving_latest.md

loadtest: install
	BEAMSERVE_DATA=$(DATA) $(PY) loadtests/run_loadtest.py --out runs/loadtest --external http://127.0.0.1:8000

# Spike, replica and gateway kills, SIGTERM under load, slow clients: each on its own server on 127.0.0.1.
faults: install
	$(PY) loadtests/faults.py

# The production Serve config on a multi-node Ray cluster on this host (loadtests/cluster.py): node loss,
# live reconfiguration, a model rollout and autoscaling under load.
cluster-faults: install
	$(PY) loadtests/cluster_faults.py

# Twenty minutes of texts, glossaries and documents on that cluster while worker nodes, Gateway and model
# replicas die and the head and the records store restart, each twice (loadtests/chaos.py).
chaos: install
	$(PY) loadtests/chaos.py --out runs/chaos.md

# One sentence at a time served against in-process decoding, and the saturated served rate against offline.
bench-latency: install
	BEAMSERVE_DATA=$(DATA) $(PY) loadtests/bench_latency.py --out runs/bench/latency_latest.md

# A longer, seeded mutation run of Office documents and glossaries than make test's (FUZZ_SEED, FUZZ_CASES to change it).
FUZZ_SEED ?= 1
FUZZ_CASES ?= 5000
fuzz: install
	BEAMSERVE_FUZZ_SEED=$(FUZZ_SEED) BEAMSERVE_FUZZ_CASES=$(FUZZ_CASES) $(PY) -m pytest -q tests/test_hostile_documents.py tests/test_hostile_glossaries.py -k mutated

# An hour of mixed traffic and fuzzing; the replicas' resident memory at the end against after warm-up.
soak: install
	$(PY) loadtests/faults.py --cases soak --duration 3600

# deploy/requirements.lock: the image's Python dependencies with their hashes (torch aside: the image
# installs it from the PyTorch index of its flavour). Run after changing pyproject.toml's dependencies.
lock: install
	$(PY) -c 'import tomllib; p = tomllib.load(open("pyproject.toml", "rb"))["project"]; \
	print("\n".join(d for d in p["dependencies"] + p["optional-dependencies"]["serve"] if not d.startswith("torch")))' \
	> $(VENV)/lock.in
	$(VENV)/bin/uv pip compile $(VENV)/lock.in --generate-hashes --python-version 3.11 \
	  --python-platform x86_64-manylinux_2_28 --custom-compile-command "make lock" -q -o deploy/requirements.lock

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache
