#!/usr/bin/env bash
# The README's two commands on a clone of this repository alone: no ../shared beside it, no
# GNLL_DATA_DIR. The main job's first questions (on the sample shipped with gnll) and the fast tier.
# A venv that sees the machine's packages keeps the installs quick; the clone is installed into it.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d /tmp/gnll-alone.XXXXXX)"
trap 'rm -rf "$work"' EXIT
git clone -q "$root" "$work/gnll"
python -m venv --system-site-packages "$work/venv"
# shellcheck disable=SC1091
. "$work/venv/bin/activate"
unset GNLL_DATA_DIR GNLL_TEST_FULL_DATA
cd "$work/gnll"
test ! -e ../shared
start=$SECONDS
echo "== clone alone: the main job's first questions"
LIMIT=6 SAMPLES=2 OUTPUT="$work/demo" bash scripts/demo.sh | tee "$work/demo.log"
grep -q "embedded sample, 520 of the triviaqa_unfiltered_validation.jsonl" "$work/demo/table.md"
python -c "import gnll, sys; sys.exit(not gnll.__file__.startswith('$work/gnll/'))"
echo "== clone alone: the fast tier"
bash scripts/test.sh --fast
echo "== clone alone: $((SECONDS - start)) s"
