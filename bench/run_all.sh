#!/usr/bin/env bash
# Run every benchmark, write bench/results/*.json and refresh the tables of BENCHMARKS.md.
#
#   bench/run_all.sh            # full figures (about an hour on an idle 2-core machine)
#   bench/run_all.sh --quick    # smoke-sized, writes to /tmp/gnll-bench-quick instead
#
# Environment: OUT (results folder), MAX_LOAD (wait until the 1-min load average is below it,
# default 1.5), WAIT_MINUTES (give up waiting after this long and run anyway, default 60),
# ONLY (space-separated subset, e.g. ONLY="overhead throughput").
set -euo pipefail
cd "$(dirname "$0")/.."

QUICK=""
OUT_DEFAULT="bench/results"
if [[ "${1:-}" == "--quick" ]]; then
  QUICK="--quick"
  OUT_DEFAULT="/tmp/gnll-bench-quick"
fi
OUT="${OUT:-$OUT_DEFAULT}"
MAX_LOAD="${MAX_LOAD:-1.5}"
WAIT_MINUTES="${WAIT_MINUTES:-60}"
ALL="load_times overhead cost_per_method throughput scaling simulation beam_stage eval_speed prefix_attention stop_split continuous_batching distributed early_decisions"
ONLY="${ONLY:-$ALL}"
mkdir -p "$OUT"

# Figures taken under someone else's CPU load are not comparable: wait for a quiet machine.
wait_quiet() {
  local waited=0
  while true; do
    local load
    load=$(cut -d' ' -f1 /proc/loadavg)
    if python -c "import sys; sys.exit(0 if float('$load') < float('$MAX_LOAD') else 1)"; then
      echo "load average $load < $MAX_LOAD: running $1"
      return
    fi
    if (( waited >= WAIT_MINUTES )); then
      echo "load average still $load after ${WAIT_MINUTES} min: running $1 anyway (recorded)"
      return
    fi
    echo "load average $load >= $MAX_LOAD: waiting (${waited}/${WAIT_MINUTES} min)"
    sleep 60
    waited=$((waited + 1))
  done
}

for name in $ONLY; do
  [[ -z "$QUICK" ]] && wait_quiet "$name"
  echo "=== $name"
  python "bench/$name.py" $QUICK --output "$OUT/$name.json"
done

if [[ -z "$QUICK" ]]; then
  python bench/report.py --results "$OUT" --update BENCHMARKS.md
else
  python bench/report.py --results "$OUT"
fi
