#!/usr/bin/env bash
# Regenerate the calibration files shipped for the embedded models (src/gnll/calibration/shipped/).
#
# For each model: a G-NLL-only `gnll eval` on the bundled datasets' eval splits (LIMIT questions per
# short task, greedy decoding only: no beams, no samples), then `gnll calibrate` on its samples.jsonl.
# Usage: scripts/calibrate_embedded.sh [LIMIT]   (default 150; runs/ keeps the eval runs, --resume safe)
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT="${1:-150}"
DATA_DIR="${DATA_DIR:-../shared/data}"
OUT=src/gnll/calibration/shipped
mkdir -p "$OUT" runs
for MODEL in smollm2-135m-instruct gemma-3-270m; do
  RUN="runs/calib-$MODEL"
  OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" gnll eval --model "$MODEL" \
    --tasks triviaqa_short,svamp_short,nq_open_short --limit "$LIMIT" --measures g-nll \
    --correctness f1,contains --data_dir "$DATA_DIR" --no-plots --no-progress --resume \
    --output_path "$RUN"
  gnll calibrate "$RUN" --output "$OUT/$MODEL.json" --plot "$OUT/$MODEL.reliability.png"
done
