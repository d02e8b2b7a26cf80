#!/usr/bin/env bash
# The worked example of docs/scoring.md, end to end; rerun it to regenerate the figure and outputs.
# The eval run is the expensive step (G-NLL only: greedy decoding of 450 questions, about 15 min on
# a loaded 2-core machine, a few minutes on an idle one); --resume reuses a finished run.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
RUN=runs/calib-smollm2-135m-instruct
gnll eval --model smollm2-135m-instruct --tasks triviaqa_short,svamp_short,nq_open_short \
  --limit 150 --measures g-nll --correctness f1,contains --data_dir "${GNLL_DATA_DIR:?set GNLL_DATA_DIR to the folder of the full data files}" \
  --no-plots --no-progress --resume --output_path "$RUN"
gnll calibrate "$RUN" --output runs/smollm2-eval-calibration.json \
  --plot docs/figures/reliability-smollm2-eval.png
# Exit status 1 is expected: row q9 has no answer and goes to the errors file.
gnll score --input docs/examples/answers.jsonl --output runs/answers.scored.jsonl \
  --calibration auto --with-greedy --no-progress || test $? -eq 1
cat runs/answers.scored.jsonl.errors.jsonl
python - <<'PY'
import json
for line in open("runs/answers.scored.jsonl"):
    r = json.loads(line)
    print(f"{r['id']:3} {r['answer'][:31]:31} nll={r['nll']:6.3f} tokens={r['num_tokens']:2} "
          f"is_greedy={r['is_greedy']!s:5} greedy_stops={r['greedy_stops']!s:5} "
          f"p_correct={r['p_correct']:.3f} abstain={r['abstain']}")
PY
gnll ask "What is the capital of France?" --calibration auto
