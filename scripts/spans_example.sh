#!/usr/bin/env bash
# The span examples of docs/scoring.md: sentence and JSON-field NLLs of given answers (gnll score
# --spans) and of a generated one (gnll ask --spans), on the embedded SmolLM2; about a minute.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"
mkdir -p runs
gnll score --input docs/examples/spans-sentences.jsonl --output runs/spans-sentences.jsonl \
  --long --spans sentence --no-progress
gnll score --input docs/examples/spans-json.jsonl --output runs/spans-json.jsonl \
  --spans json --no-progress
python - <<'PY'
import json
for name in ("runs/spans-sentences.jsonl", "runs/spans-json.jsonl"):
    for line in open(name):
        r = json.loads(line)
        print(f"{r['id']}  nll={r['nll']:.3f}  least certain: {r['least_certain_span']}  "
              f"not in a span: {r['unassigned_nll']:.3f}")
        for s in r["spans"]:
            print(f"    {s['path']:12} {s['nll']:7.3f}  {s['num_tokens']:2} tokens  {s['text']}")
PY
gnll ask "Tell me about the Eiffel Tower." --long --spans sentence
