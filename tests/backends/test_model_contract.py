"""The ``Model`` contract says what its callers use; callers do not reach around it."""

from __future__ import annotations

import asyncio
import re
from pathlib import Path

import pytest

from gnll.backends.base import (
    Capabilities,
    ChatPrompt,
    Generation,
    GenerationConfig,
    Model,
    chat_messages,
)
from gnll.backends.identity import model_identity
from gnll.backends.registry import BACKENDS, register_backend
from gnll.serving.engine import BatchingEngine
from gnll.serving.inprocess import chat_prompt
from gnll.serving.schemas import ChatMessage

SRC = Path(__file__).resolve().parents[2] / "src" / "gnll"


class Templated(Model):
    """A chat model that records how it was asked to render and generate."""

    name = "templated"
    capabilities = Capabilities(beams=False, scoring=False, chat=True)

    def __init__(self) -> None:
        self.calls: list[tuple[list[str], bool]] = []

    def render_prompt(self, prompt: str) -> str:
        return "".join(f"<{m['role']}>{m['content']}" for m in chat_messages(prompt)) + "<a>"

    def generate(self, prompts, config=None, *, batch_size=None, progress=False, raw_prompt=False):
        self.calls.append(
            ([p if raw_prompt else self.render_prompt(p) for p in prompts], raw_prompt)
        )
        return [[Generation("ok", [1], ["ok"], [-0.1], "eos")] for _ in prompts]

    def score(self, prompts, answers, **kw):
        raise NotImplementedError


def test_a_model_declares_capabilities_and_renders_chat_through_render_prompt():
    class Bare(Model):
        name = "bare"

        def generate(self, prompts, config=None, **kw):
            return []

        def score(self, prompts, answers, **kw):
            return []

        def render_prompt(self, prompt):
            return str(prompt)

    # declared on the contract, not looked up; a backend that declares nothing claims nothing
    # beyond generation
    caps = Bare().capabilities
    assert caps == Capabilities(
        beams=False, scoring=False, terminator=False, sampling_logprobs=False
    )
    assert caps.missing(["beams", "scoring", "terminator", "sampling_logprobs"]) == [
        "beams",
        "scoring",
        "terminator",
        "sampling_logprobs",
    ]
    turns = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi?"}]
    # without a template: the contents joined by blank lines; with one: the model's own renderer
    assert Bare().render_chat(turns) == "Be brief.\n\nHi?"
    assert Templated().render_chat(turns) == "<system>Be brief.<user>Hi?<a>"


def test_the_engine_passes_raw_prompts_and_chat_turns_through_the_contract():
    model = Templated()
    engine = BatchingEngine(model)
    messages = [ChatMessage(role="system", content="S"), ChatMessage(role="user", content="Q")]
    prompt = chat_prompt(messages)
    assert isinstance(prompt, ChatPrompt) and prompt.messages[0]["role"] == "system"

    async def main():
        engine.start()
        try:
            await engine.submit(["exact text"], GenerationConfig(), raw=True)
            await engine.submit([prompt], GenerationConfig())
        finally:
            engine.stop()

    asyncio.run(main())
    assert model.calls == [(["exact text"], True), (["<system>S<user>Q<a>"], False)]


def test_identity_comes_from_the_registered_backend():
    @register_backend("contract-local", identity=lambda name, args: {"kind": "mine", "m": name})
    def load_local(name, *, progress=True, **model_args):
        raise NotImplementedError

    @register_backend("contract-plain")
    def load_plain(name, *, progress=True, **model_args):
        raise NotImplementedError

    try:
        assert model_identity("x", {"backend": "contract-local"}) == {"kind": "mine", "m": "x"}
        # a backend that says nothing is not taken for a server
        plain = model_identity("x", {"backend": "contract-plain"})
        assert plain == {"kind": "backend", "backend": "contract-plain", "model": "x"}
    finally:
        BACKENDS.pop("contract-local", None)
        BACKENDS.pop("contract-plain", None)


@pytest.mark.parametrize(
    "package", ["serving", "cli", "evaluation", "scoring", "distributed", "semantic", "calibration"]
)
def test_callers_do_not_reach_around_the_contract(package):
    # getattr/hasattr probes of a model, a private attribute of one, or its generate's signature
    reach = re.compile(
        r'(getattr|hasattr)\([^,]*model, "|\bmodel\._[a-z]|inspect\.signature\([^)]*\.generate\)'
    )
    hits = [
        f"{path.relative_to(SRC)}:{i}"
        for path in (SRC / package).rglob("*.py")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if reach.search(line)
    ]
    assert hits == []


#: The concrete model classes of the backends: what a model is, callers learn from its declared
#: capabilities (``capabilities.reasoning``, ``Model.scored``, ``Model.answer_decoder``), never
#: from its class.
CONCRETE = ("ReasoningModel", "HFModel", "OpenAICompatModel", "EmbeddedModel")
#: Known exceptions, each a backend-specific feature (not a question of what a model is):
#: the next-token figure reads the hf forward pass; /v1/decisions' first-token fallback reads
#: an OpenAI-compatible upstream's top log-probs.
ASKED_BY_DESIGN = {
    "evaluation/figures/next_tokens.py": "HFModel",
    "serving/decisions.py": "OpenAICompatModel",
}


@pytest.mark.parametrize(
    "package",
    [
        "serving",
        "cli",
        "evaluation",
        "scoring",
        "distributed",
        "semantic",
        "calibration",
        "integrations",
        "policy",
    ],
)
def test_callers_never_ask_a_models_concrete_class(package):
    asks = re.compile(rf"(isinstance\([^)]*\b|cast\(\s*)({'|'.join(CONCRETE)})\b")
    hits = [
        f"{path.relative_to(SRC)}:{i}"
        for path in (SRC / package).rglob("*.py")
        for i, line in enumerate(path.read_text().splitlines(), 1)
        if (m := asks.search(line))
        and ASKED_BY_DESIGN.get(str(path.relative_to(SRC))) != m.group(2)
    ]
    assert hits == []


def test_a_reasoning_model_declares_what_it_is():
    from gnll.backends.reasoning_model import ReasoningModel

    class Plain(Model):
        name, capabilities = "plain", Capabilities(streaming=False)

        def generate(self, prompts, config=None, **kw):
            raise NotImplementedError

        def score(self, *a, **kw):
            raise NotImplementedError

        def render_prompt(self, p):
            return str(p)

    plain = Plain()
    thinker = ReasoningModel(plain, "harmony")
    assert (plain.capabilities.reasoning, plain.scored, plain.answer_decoder()) == (
        None,
        "output",
        None,
    )
    assert (thinker.capabilities.reasoning, thinker.scored) == ("harmony", "answer")
    assert thinker.answer_decoder() is None  # the model it wraps has no decoding loop
