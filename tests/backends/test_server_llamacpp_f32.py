"""The llama.cpp server path is exact on exact weights: a float32 GGUF served by llama-cpp-python.

On the shipped Q4_1 GGUF llama.cpp quantises the activations of its matrix products, so its greedy
answers part from the in-process backend's at near-ties (tests/backends/test_server_llamacpp.py). Served from
a float32 copy of the same de-quantised weights (:func:`gnll.backends.dequantise.dequantised_gguf`)
both compute the same function in the same precision: any remaining gap would be gnll's own (prompt
rendering, tokenisation, log-prob parsing, the terminator split). docs/servers.md has the 50-prompt
figure (``python scripts/server_agreement.py --prompts 50 --max-new-tokens 32 --float32``).
It found one such gap: a stop token after a character split over byte tokens was counted as an
answer token (fixed in :mod:`gnll.backends.openai.parse`; prompt 12 below).
"""

from __future__ import annotations

import statistics
from pathlib import Path

import gguf as gguf_lib
import numpy as np
import pytest

from gnll import GenerationConfig, load_model
from gnll.backends.dequantise import ALL_F32, dequantised_gguf
from gnll.backends.registry import EMBEDDED_MODELS

pytestmark = [pytest.mark.model, pytest.mark.server]

MODEL = "smollm2-135m-instruct"
#: The first ten TriviaQA evaluation prompts, and prompt 12, whose answer ends in a character split
#: over two byte tokens (the server sends them as empty strings) before the stop token.
PROMPTS = [*range(10), 12]
#: Measured on all 50 prompts (docs/servers.md): 50 equal answers, |ΔG-NLL| at most 4e-5 nats.
MIN_EQUAL = len(PROMPTS)
MAX_MEDIAN_GNLL_DIFF = 0.01
MAX_GNLL_DIFF = 1e-3


@pytest.fixture(scope="module")
def f32_gguf(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("gguf-f32")
    return dequantised_gguf(EMBEDDED_MODELS[MODEL].gguf(tmp), tmp / "model-f32.gguf")


def test_the_float32_copy_holds_the_dequantised_tensors_and_the_metadata(f32_gguf, tmp_path):
    source = gguf_lib.GGUFReader(EMBEDDED_MODELS[MODEL].gguf(tmp_path))
    copy = gguf_lib.GGUFReader(f32_gguf)
    assert copy.fields["general.file_type"].contents() == ALL_F32
    assert source.fields["general.file_type"].contents() != ALL_F32
    skip = {"general.file_type"}
    assert {k for k in source.fields if not k.startswith("GGUF.")} == {
        k for k in copy.fields if not k.startswith("GGUF.")
    }
    for name, field in source.fields.items():
        if name not in skip and not name.startswith("GGUF."):
            assert copy.fields[name].contents() == field.contents(), name
    assert [t.name for t in copy.tensors] == [t.name for t in source.tensors]
    quantised = 0
    for a, b in zip(source.tensors, copy.tensors, strict=True):
        assert b.tensor_type == gguf_lib.GGMLQuantizationType.F32
        assert list(a.shape) == list(b.shape), a.name
        quantised += a.tensor_type != gguf_lib.GGMLQuantizationType.F32
        assert np.array_equal(gguf_lib.quants.dequantize(a.data, a.tensor_type), b.data), a.name
    assert quantised > 0  # the source really was quantised


def test_greedy_answers_and_gnll_equal_the_in_process_backend_on_float32_weights(smollm, f32_gguf):
    from gnll.backends.openai.launch import LlamaServer
    from gnll.evaluation.data.tasks import get_task

    td = get_task("triviaqa_short").load(seed=0)
    pool = td.split("eval", max(PROMPTS) + 1)
    prompts = [td.prompt(pool[i]) for i in PROMPTS]
    cfg = GenerationConfig.greedy(max_new_tokens=32)
    hf = [g[0] for g in smollm.generate(prompts, cfg)]
    with LlamaServer(f32_gguf, MODEL, lifetime=1200) as server:
        served = load_model(MODEL, backend="openai", base_url=server.base_url, concurrency=1)
        sv = [g[0] for g in served.generate(prompts, cfg)]
    same = [(a, b) for a, b in zip(hf, sv, strict=True) if a.text == b.text]
    assert len(same) >= MIN_EQUAL, [(a.text, b.text) for a, b in zip(hf, sv, strict=True)]
    diffs = [abs(sum(a.token_logprobs) - sum(b.token_logprobs)) for a, b in same]
    assert statistics.median(diffs) <= MAX_MEDIAN_GNLL_DIFF, sorted(diffs)
    assert max(diffs) <= MAX_GNLL_DIFF, sorted(diffs)
    assert [len(a.tokens) for a, _ in same] == [len(b.tokens) for _, b in same]
