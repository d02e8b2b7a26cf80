#!/usr/bin/env bash
# Record LM-Polygraph's numbers on the embedded SmolLM2 (tests/evaluation/data/polygraph_msp.json).
# LM-Polygraph gets its own venv (VENV, default /work/venv-polygraph): its pins clash with gnll's.
# The venv sees the shared torch and transformers (--system-site-packages), so both tools run the
# same model code; lm-polygraph itself is installed without its pinned dependencies, plus the
# packages it imports at start-up. Usage: bash scripts/polygraph_fixture.sh [--limit 40]
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-/work/venv-polygraph}
if [ ! -x "$VENV/bin/python" ]; then
  python -m venv --system-site-packages "$VENV"
fi
if ! "$VENV/bin/python" -c "import lm_polygraph" 2>/dev/null; then
  "$VENV/bin/pip" install -q --no-deps lm-polygraph==0.7.0
  # what `import lm_polygraph` needs beyond gnll's environment
  "$VENV/bin/pip" install -q datasets spacy boostedprob rouge_score sacrebleu bert_score omegaconf
fi
PYTHONPATH="$PWD/src" OMP_NUM_THREADS=${OMP_NUM_THREADS:-1} "$VENV/bin/python" scripts/polygraph_fixture.py "$@"
