#!/usr/bin/env bash
# The GPU stage: everything that needs a GPU, in one call of the lent GPU machine (15 minutes, its
# start-up included), within 8 minutes on an H100 or H200. Runs from the repository root with the
# machine's own python3 (torch with CUDA, transformers, sentencepiece, safetensors); writes every
# report and log under ${OUT:-gpu_out}/, with summary.txt saying what each part did.
#
#   bash loadtests/gpu_run.sh               # the stage: the parts below in priority order, ~8 minutes
#   bash loadtests/gpu_run.sh profile-static decode    # parts by name, each its own limit
#   bash loadtests/gpu_run.sh batching packing cudnn   # the longer benchmarks, for a machine held longer
#
# Parts, each with its own time limit, cut to what is left of STAGE_S (480 s) and skipped under 20 s; with no
# part named, these in this order (their limits sum past the budget: the later parts run as far as the earlier
# ones leave time; on an H200 all of them took about 560 s):
#   tests    the CUDA tests (pytest -m cuda): graph replay = eager decoding token for token (the compiled
#            step's graphs too), a step under torch.cuda.set_sync_debug_mode("error"), capture memory
#            bounded, the engine on graphs; and the Triton kernels compiled (tests/test_triton.py), the fused
#            step graphed against the operators' eager step, its kernel count (tests/test_step_budget.py)
#   decode   beam 4, batches 64 and 256: eager, static/graph (PyTorch's step kernels, then Triton's), Hugging
#            Face and CTranslate2 float16
#   profile-static, profile-base, profile-wide  host against device time per decode step, the kernels by device
#            time and their count a step: the static step at en-de's and OPUS-MT-base's shapes, batch 64, and
#            en-de's at batch 256 (the served engine's 1,024 rows)
#   shapes   the shapes people deploy: random OPUS-MT-base and NLLB-600M models, beam 4, batch 64, 32 steps:
#            eager, static/graph (PyTorch's and Triton's step kernels) and Hugging Face float16
#   served   the engine under open-loop arrivals on the static decode state
#   compiled the static step through torch.compile's inductor before its graphs, against the eager one's graphs
#   profile-compiled, profile-eager  the same profile of the compiled static step and of the eager decoder
#   served-compiled  the engine under arrivals, its static step compiled by inductor (Settings.compiled_step)
#   memory   one replica's device memory (loadtests/replica_memory.py)
# (`profile` names the five profile parts.)
#
# Wheels. The machine lacks pytest and pydantic (and Ray and OpenTelemetry: the served part drives the
# engine a replica runs, without HTTP, and nothing the stage imports needs them). Before the call:
#   make gpu-wheels          # downloads them for the machine's Python (GPU_PY, 3.12) into .whl/
# and carry ".whl" in the call. They are unpacked into a temporary directory on PYTHONPATH, nothing
# installed. Without them the tests part fails to import. CTranslate2's wheel links CUDA 12, so on a
# CUDA 13 machine decode reports it as not run (GPU_EXTRA=ctranslate2 adds it where CUDA 12 is).
set -uo pipefail
out=${OUT:-gpu_out}; mkdir -p "$out"
start=$(date +%s); budget=${STAGE_S:-480}
wheels=$(mktemp -d); trap 'rm -rf "$wheels"' EXIT
for w in .whl/*.whl; do [ -e "$w" ] && python3 -m zipfile -e "$w" "$wheels"; done
export PYTHONPATH=$PWD:$wheels PYTHONUNBUFFERED=1 BEAMSERVE_DATA=${BEAMSERVE_DATA:-$PWD/tests/data/multi30k}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "import sys, torch, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, \
'transformers', transformers.__version__)" | tee -a "$out/gpu.txt"
python3 -c "import ctranslate2; print('ctranslate2', ctranslate2.__version__, 'CUDA devices', \
ctranslate2.get_cuda_device_count())" 2>&1 | tail -1 | tee -a "$out/gpu.txt"

# part NAME LIMIT_S LOG COMMAND...: run within min(LIMIT_S, what is left), logged; a line in summary.txt.
part() {
  local name=$1 limit=$2 log=$3; shift 3
  local left=$((budget - ($(date +%s) - start)))
  ((limit > left)) && limit=$left
  if ((limit < 20)); then echo "$name: skipped, ${left}s left" | tee -a "$out/summary.txt"; return; fi
  echo "== $name $(date +%T), up to ${limit}s"
  local t0; t0=$(date +%s)
  timeout "$limit" "$@" 2>&1 | tee "$out/$log"
  local rc=${PIPESTATUS[0]}
  echo "$name: exit $rc in $(($(date +%s) - t0))s (limit ${limit}s)" | tee -a "$out/summary.txt"
}

stage() {
  case $1 in
    tests) part tests 150 pytest.txt python3 -m pytest -q -rA -s -p no:cacheprovider -o addopts="" \
             -m "cuda or triton" tests/test_cuda.py tests/test_slots.py tests/test_engine.py tests/test_triton.py \
             tests/test_step_budget.py ;;
    decode) part decode 130 decode.txt python3 loadtests/bench_decode.py --device cuda --models en-de \
              --systems beamserve,beamserve-slots,beamserve-slots-triton,hf,ct2-float16 --beams 4 --batch-sizes 64,256 --sentences 1000 \
              --repeats 2 --out "$out/decode_gpu.md" ;;
    shapes) part shapes 120 shapes.txt python3 loadtests/bench_decode.py --device cuda --models base,nllb-600m \
              --systems beamserve,beamserve-slots,beamserve-slots-triton,hf --beams 4 --batch-sizes 64 --steps 32 --sentences 256 \
              --repeats 1 --out "$out/decode_gpu_shapes.md" ;;
    compiled) part compiled 120 compiled.txt python3 loadtests/bench_decode.py --device cuda --models en-de \
                --systems beamserve-slots,beamserve-slots-compiled,hf --beams 4 --batch-sizes 64 --sentences 512 \
                --repeats 1 --out "$out/decode_gpu_compiled.md" ;;
    profile) for p in profile-compiled profile-static profile-wide profile-eager profile-base; do stage $p; done ;;
    profile-compiled) part profile-compiled 120 profile_compiled.txt python3 loadtests/profile_decode.py --device cuda \
                        --compiled ;;
    profile-static) part profile-static 30 profile_static.txt python3 loadtests/profile_decode.py --device cuda --slots ;;
    profile-wide) part profile-wide 30 profile_wide.txt python3 loadtests/profile_decode.py --device cuda --slots \
                    --batch 256 ;;
    profile-eager) part profile-eager 30 profile_eager.txt python3 loadtests/profile_decode.py --device cuda ;;
    profile-base) part profile-base 60 profile_base.txt python3 loadtests/profile_decode.py --device cuda --model base \
                    --slots ;;
    memory) part memory 30 memory.txt python3 loadtests/replica_memory.py --device cuda --out "$out/memory_gpu.md" ;;
    served) part served 120 served.txt python3 loadtests/bench_batching.py --device cuda --static-slots \
              --configs continuous --duration 3 --repeats 1 --bisect 0 --capacity-sentences 512 \
              --rates 256,512,1024,1536,2048,2560,3072 --out "$out/batching_gpu_static.md" ;;
    served-compiled) part served-compiled 180 served_compiled.txt python3 loadtests/bench_batching.py --device cuda \
                       --compiled-step --configs continuous --duration 3 --repeats 1 --bisect 0 \
                       --capacity-sentences 512 --rates 256,512,1024,1536,2048,3072 \
                       --out "$out/batching_gpu_compiled.md" ;;
    batching) part batching 300 batching.txt python3 loadtests/bench_batching.py --device cuda --duration 5 \
                --repeats 1 --rates 8,16,32,64,96,128,192,256,320,384,512,640,768,1024,1280,1536,2048 \
                --out "$out/batching_gpu.md" ;;
    packing) part packing 400 packing.txt python3 loadtests/bench_packing.py --device cuda --replicas 1,2,4,8 \
               --requests 4096 --out "$out/packing_gpu.md" ;;
    cudnn) part cudnn 150 cudnn.txt python3 loadtests/probe_cudnn_attention.py ;;
    *) echo "unknown part $1" | tee -a "$out/summary.txt" ;;
  esac
}

if (($# == 0)); then
  set -- tests decode profile-static profile-base profile-wide shapes served compiled profile-compiled \
    served-compiled profile-eager memory
else
  budget=${STAGE_S:-3600}  # parts named: each its own limit
fi
for name in "$@"; do stage "$name"; done
echo "== done $(date +%T), $(($(date +%s) - start))s" | tee -a "$out/summary.txt"
