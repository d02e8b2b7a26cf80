#!/usr/bin/env bash
# The prompt-format comparison of docs/evaluation.md ("Prompt format for chat models"): the same
# few-shot prompt given to SmolLM2-135M-Instruct three ways, G-NLL only (the greedy pass), then one
# table of accuracy (F1) and G-NLL / LN-G-NLL AUROC per task and format.
#
#   single     the paper's protocol: the whole prompt as one user turn of the chat template (default)
#   multiturn  --fewshot_as_multiturn: few-shot questions as user turns, their answers as assistant turns
#   plain      --model_args chat_template=false: the prompt text as is, no chat template
#
# Environment: LIMIT (questions per task, default 200), TASKS (default the three short tasks), OUT
# (default runs/prompts), GNLL_DATA_DIR. Runs already in OUT are resumed, not recomputed.
set -euo pipefail
cd "$(dirname "$0")/.."
LIMIT="${LIMIT:-200}"
TASKS="${TASKS:-triviaqa_short,svamp_short,nq_open_short}"
OUT="${OUT:-runs/prompts}"
DATA_DIR="${GNLL_DATA_DIR:?set GNLL_DATA_DIR to the folder of the full data files}"
for fmt in single multiturn plain; do
  case $fmt in
    single) extra=() ;;
    multiturn) extra=(--fewshot_as_multiturn) ;;
    plain) extra=(--model_args chat_template=false) ;;
  esac
  gnll eval --model smollm2-135m-instruct --tasks "$TASKS" --limit "$LIMIT" \
    --measures g-nll,ln-g-nll --data_dir "$DATA_DIR" --output_path "$OUT/$fmt" --overwrite --no-plots \
    --resume "${extra[@]}" > /dev/null
done
python - "$OUT" <<'EOF'
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
print("| task | format | n | correct | accuracy | G-NLL AUROC | LN-G-NLL AUROC |")
print("|---|---|---|---|---|---|---|")
runs = {fmt: json.loads((out / fmt / "results.json").read_text()) for fmt in ("single", "multiturn", "plain")}
for task in next(iter(runs.values()))["tasks"]:
    for fmt, res in runs.items():
        m = res["tasks"][task]["metrics"]["f1"]
        def cell(name):
            x = m["measures"][name]
            if x["auroc"] is None:
                return "–"
            return f"{x['auroc']:.3f} ± {x['auroc_se']:.3f}"
        correct = round(m["accuracy"] * m["n"])
        print(f"| {task} | {fmt} | {m['n']} | {correct} | {m['accuracy']:.3f} | {cell('g-nll')} | {cell('ln-g-nll')} |")
EOF
