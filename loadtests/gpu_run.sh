#!/usr/bin/env bash
# Everything that needs a GPU, in one go (a lent GPU machine's time is short): the CUDA tests, a
# profile of one decode, the decoding benchmark and the batching benchmark (no batching /
# request-level / continuous) on the GPU. Runs from the repository root with the machine's own
# python3 (torch with CUDA, transformers); writes logs under ${OUT:-gpu_out}/.
#
#   bash loadtests/gpu_run.sh tests decode                   # at most 8 minutes on an H100
#   bash loadtests/gpu_run.sh profile batching batching-cpu-sizes  # at most 10 minutes
#   bash loadtests/gpu_run.sh packing                        # replicas per GPU (Serve's fractional num_gpus)
#   (no stage named: all of them, for a machine held longer than one 10-minute call)
#
# Each stage has its own time limit, so one slow stage cannot eat the others' share of a lease.
# batching runs at the sizes a GPU replica takes when they are unset (1,024 decode slots, 256 sentences);
# batching-cpu-sizes pins the CPU's (256 slots, 64 sentences) to compare.
set -uo pipefail
out=${OUT:-gpu_out}; mkdir -p "$out"
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 BEAMSERVE_DATA=${BEAMSERVE_DATA:-$PWD/tests/data/multi30k}
stages=${*:-tests decode profile batching batching-cpu-sizes cudnn packing}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"
for stage in $stages; do
  echo "== $stage $(date +%T)"
  case $stage in
    tests) timeout 200 python3 -m pytest -q -s -p no:cacheprovider -o addopts="" tests/test_cuda.py \
             tests/test_slots.py tests/test_transformer.py tests/test_inflight.py tests/test_engine.py 2>&1 \
             | tail -15 | tee "$out/pytest.txt" ;;
    profile) { timeout 90 python3 loadtests/profile_decode.py --device cuda 2>&1 | tail -3
               timeout 120 python3 loadtests/profile_decode.py --device cuda --slots 2>&1 | tail -25; } \
               | tee "$out/profile.txt" ;;
    cudnn) timeout 150 python3 loadtests/probe_cudnn_attention.py 2>&1 | tee "$out/cudnn.txt" ;;
    decode) timeout 280 python3 loadtests/bench_decode.py --device cuda --models en-de \
              --systems beamserve,beamserve-slots,hf,ct2-float16 --beams 4 --batch-sizes 64,256 --sentences 512 \
              --repeats 3 --out "$out/decode_gpu.md" 2>&1 | tail -25 ;;
    batching) timeout 300 python3 loadtests/bench_batching.py --device cuda --duration 5 --repeats 1 \
                --rates 8,16,32,64,96,128,192,256,320,384,512,640,768,1024,1280,1536,2048 \
                --out "$out/batching_gpu.md" 2>&1 | tail -30 ;;
    batching-cpu-sizes) timeout 240 python3 loadtests/bench_batching.py --device cuda --sizes-for cpu --duration 5 \
        --repeats 1 --bisect 1 --configs request,continuous --rates 64,128,256,320,384,448,512,640 \
        --out "$out/batching_gpu_cpu_sizes.md" 2>&1 | tail -30 ;;
    packing) timeout 400 python3 loadtests/bench_packing.py --device cuda --replicas 1,2,4,8 --requests 4096 \
               --out "$out/packing_gpu.md" 2>&1 | tail -12 ;;
    *) echo "unknown stage $stage" ;;
  esac
done
echo "== done $(date +%T)"
