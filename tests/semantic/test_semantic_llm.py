"""The LLM-entailment clusterer: prompt, both directions, reply parsing, batching; and a plumbing
run on the real embedded SmolLM2."""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
import pytest

from gnll.backends import Generation, GenerationConfig, Model
from gnll.backends.base import Capabilities
from gnll.semantic import (
    LLMEntailmentClusterer,
    entailment_prompt,
    load_clusterer,
    parse_entailment,
)

Q = "What is the capital of France?"
PAIR = re.compile(r"Possible Answer 1: (.*)\nPossible Answer 2: (.*)\n")


class ScriptedModel(Model):
    """A fake language model: replies come from ``script(answer1, answer2)``; records every call."""

    capabilities = Capabilities()  # beams, scoring, terminator, tempered log-probs

    name = "scripted"

    def __init__(self, script):
        self.script = script
        self.calls: list[tuple[list[str], GenerationConfig]] = []

    def generate(self, prompts, config=None, *, batch_size=None, progress=False):
        self.calls.append((list(prompts), config))
        out = []
        for p in prompts:
            a, b = PAIR.search(p).groups()
            text = self.script(a, b)
            out.append([Generation(text, [], [], [], "stop", stop_sequence="\n")])
        return out

    def score(self, prompts: Sequence[str], continuations) -> list[np.ndarray]:
        raise NotImplementedError

    def render_prompt(self, prompt: str) -> str:
        return prompt


def test_prompt_is_the_reference_wording():
    p = entailment_prompt(Q, "Paris", "Lyon")
    assert p == (
        'We are evaluating answers to the question "What is the capital of France?"\n'
        "Here are two possible answers:\n"
        "Possible Answer 1: Paris\nPossible Answer 2: Lyon\n"
        "Does Possible Answer 1 semantically entail Possible Answer 2? "
        "Respond only with entailment, contradiction, or neutral.\n"
        "Response:"
    )


@pytest.mark.parametrize(
    ("reply", "label"),
    [
        ("entailment", "entailment"),
        (" Entailment.", "entailment"),
        ("ENTAILMENT", "entailment"),
        ("Contradiction", "contradiction"),
        ("contradiction, not entailment", "contradiction"),  # earliest word wins
        ("Neutral", "neutral"),
        ("neutral (no entailment)", "neutral"),
        ("The answer entails the other", "entailment"),
        ("Yes", None),
        ("", None),
        ("I am not sure what to say here, but entailment", None),  # beyond the first 30 chars
    ],
)
def test_parse_entailment(reply, label):
    assert parse_entailment(reply) == label


def test_both_directions_asked_and_replies_parsed():
    def script(a, b):
        if a == b:
            return "entailment"
        if {a, b} == {"Paris", "The capital is Paris"}:
            return " Entailment."
        if a == "Paris, France" and b == "Paris":
            return "Entailment"
        if a == "Paris" and b == "Paris, France":
            return "neutral"
        return "Contradiction."

    model = ScriptedModel(script)
    c = LLMEntailmentClusterer(model, max_new_tokens=5)
    answers = ["Paris", "The capital is Paris", "Lyon", "Paris, France", "paris"]
    assert c.cluster(Q, answers) == [0, 0, 1, 2, 0]
    asked = [PAIR.search(p).groups() for prompts, _ in model.calls for p in prompts]
    # every comparison asked both ways
    assert ("The capital is Paris", "Paris") in asked and ("Paris", "The capital is Paris") in asked
    assert all((b, a) in asked for a, b in asked)
    assert all(a != "paris" and b != "paris" for a, b in asked)  # de-duplicated before the model
    # greedy, stop at newline, capped reply length
    config = model.calls[0][1]
    assert config.strategy == "greedy" and config.stop == ("\n",) and config.max_new_tokens == 5
    # one-way entailment + neutral the other way joins under the loose relation only
    loose = LLMEntailmentClusterer(ScriptedModel(script), relation="loose")
    assert loose.cluster(Q, answers) == [0, 0, 1, 0, 0]
    info = c.info()
    assert info["clusterer"] == "llm" and info["model"] == "scripted"
    assert info["relation"] == "strict"


def test_unparsed_replies_count_as_neutral():
    c = LLMEntailmentClusterer(ScriptedModel(lambda a, b: "Sure! Here is my answer"))
    assert c.cluster(Q, ["Paris", "Lyon"]) == [0, 1]
    assert c.stats.extra["unparsed_replies"] == 2
    assert c.replies[(Q, "Lyon", "Paris")] == "Sure! Here is my answer"
    loose = LLMEntailmentClusterer(ScriptedModel(lambda a, b: "maybe"), relation="loose")
    assert loose.cluster(Q, ["Paris", "Lyon"]) == [0, 1]  # neutral both ways: not equivalent


def test_cluster_many_sends_one_generate_call_per_step_and_caches():
    model = ScriptedModel(lambda a, b: "contradiction")
    c = LLMEntailmentClusterer(model)
    qs = ["q1?", "q2?"]
    answers = [["a", "b", "c"], ["x", "y"]]
    assert c.cluster_many(qs, answers) == [[0, 1, 2], [0, 1]]
    assert len(model.calls) == 2  # steps t=1 (both questions) and t=2
    assert len(model.calls[0][0]) == 4  # (b,a),(a,b) for q1 and (y,x),(x,y) for q2
    assert c.cluster_many(qs, answers) == [[0, 1, 2], [0, 1]]
    assert len(model.calls) == 2  # everything cached


def test_model_args_need_a_model_name():
    with pytest.raises(TypeError):
        LLMEntailmentClusterer(ScriptedModel(lambda a, b: "entailment"), dtype="float32")


def test_registry_accepts_a_model_instance():
    c = load_clusterer("llm", model=ScriptedModel(lambda a, b: "entailment"), relation="loose")
    assert isinstance(c, LLMEntailmentClusterer) and c.relation == "loose"
    assert c.cluster(Q, ["Paris", "Lyon"]) == [0, 0]


@pytest.mark.model
def test_llm_clusterer_on_the_real_embedded_model(smollm):
    """Plumbing on SmolLM2-135M: real prompts through the chat template, replies parsed.

    A 135M model is no reliable entailment judge, so this checks the mechanics (a valid partition,
    identical answers merged without asking, one generate call per step, every reply accounted for),
    not the quality of the verdicts.
    """
    c = LLMEntailmentClusterer(smollm, max_new_tokens=6)
    answers = ["Paris", "Lyon", "paris", "The capital is Paris", "Marseille", "Paris"]
    ids = c.cluster(Q, answers)
    assert len(ids) == len(answers) and ids[0] == 0
    assert ids[0] == ids[2] == ids[5]
    assert sorted(set(ids)) == list(range(max(ids) + 1))
    assert c.stats.unique_answers == 4
    assert 2 * 3 <= c.stats.model_inputs <= 2 * (1 + 2 + 3)
    assert c.stats.model_calls == 3
    assert 0 <= c.stats.extra["unparsed_replies"] <= c.stats.model_inputs
    assert c.info()["model"] == smollm.name
    # every reply was recorded, and the unparsed count agrees with the parser on the raw replies
    assert len(c.replies) == c.stats.model_inputs
    assert all(isinstance(r, str) for r in c.replies.values())
    unparsed = sum(parse_entailment(r) is None for r in c.replies.values())
    assert c.stats.extra["unparsed_replies"] == unparsed
    assert set(c._cache.values()) <= {"entailment", "neutral", "contradiction"}
    assert c.cluster(Q, answers) == ids  # deterministic (greedy) and now cached
