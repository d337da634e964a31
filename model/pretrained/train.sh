#!/usr/bin/env bash
# How the shipped models were trained: several runs side by side on one GPU (each is small), then
# every final model evaluated with beam 4 on val and test_2016_flickr. CPU works too, one run at a time.
# Usage: model/pretrained/train.sh DATA_DIR RUNS_DIR [MINUTES]
set -euo pipefail
data=${1:?data dir}; runs=${2:?runs dir}; minutes=${3:-6}
py=${PYTHON:-python3}
mkdir -p "$runs"
run() {  # name src tgt extra-args...
  local name=$1 src=$2 tgt=$3; shift 3
  $py -m service.cli train --data "$data" --out "$runs/$name" --src-lang "$src" --tgt-lang "$tgt" \
    --max-epochs 80 --patience 8 --max-minutes "$minutes" "$@" >"$runs/$name.log" 2>&1
}
run en-de-v8k-3x3 en de --vocab-size 8000 &
run en-de-v8k-4x4 en de --vocab-size 8000 --model-config '{"encoder_layers": 4, "decoder_layers": 4}' &
run en-de-v6k-3x3 en de --vocab-size 6000 &
run en-fr-v8k-3x3 en fr --vocab-size 8000 &
run en-fr-v6k-4x4 en fr --vocab-size 6000 --model-config '{"encoder_layers": 4, "decoder_layers": 4}' &
wait
for d in "$runs"/*/final; do
  name=$(basename "$(dirname "$d")"); tgt=${name:3:2}
  for split in val test_2016_flickr; do
    echo "== $name $split beam 4" | tee -a "$runs/eval.txt"
    $py -m service.cli evaluate --model "$d" --src "$data/$split.en.gz" --ref "$data/$split.$tgt.gz" \
      --beam-size 4 --output "$runs/$name.$split.hyp" | tee -a "$runs/eval.txt"
  done
done
# Pick the best run of each pair by validation BLEU (test is only reported, never used to choose).
$py - "$runs" <<'PY'
import pathlib, re, sys
runs = pathlib.Path(sys.argv[1])
best: dict[str, tuple[float, str]] = {}
for name, split, bleu in re.findall(r"== (\S+) (\S+) beam 4\nBLEU = ([\d.]+)", (runs / "eval.txt").read_text()):
    if split == "val":
        best[name[:5]] = max(best.get(name[:5], (0.0, "")), (float(bleu), name))
for pair, (bleu, name) in sorted(best.items()):
    print(f"best {pair}: {name} (val BLEU {bleu})")
    (runs / f"best-{pair}").write_text(name)
PY
