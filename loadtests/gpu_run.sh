#!/usr/bin/env bash
# Everything that needs a GPU, in one go (a lent GPU machine's time is short): the CUDA tests, the
# decoding benchmark on the GPU, the batching benchmark (no batching / request-level / continuous)
# on the GPU, and a profile of one decode. Runs from the repository root with the
# machine's own python3 (torch with CUDA, transformers); writes logs under ${OUT:-gpu_out}/.
set -uo pipefail
out=${OUT:-gpu_out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 BEAMSERVE_DATA=${BEAMSERVE_DATA:-$PWD/.dev/data}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"
python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_cuda.py tests/test_transformer.py tests/test_inflight.py tests/test_engine.py 2>&1 | tail -5 | tee "$out/pytest.txt"
python3 loadtests/profile_decode.py --device cuda 2>&1 | tail -30 | tee "$out/profile.txt"
python3 loadtests/bench_decode.py --device cuda --systems beamserve,hf --batch-sizes 1,16,64 --sentences 256 \
  --repeats 2 --out "$out/DECODE_BENCH_GPU.md" 2>&1 | tail -25
python3 loadtests/bench_batching.py --device cuda --duration 5 --repeats 1 --out "$out/BATCHING_BENCH_GPU.md" 2>&1 | tail -30
