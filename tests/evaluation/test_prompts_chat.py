"""Few-shot examples as chat turns (``--fewshot_as_multiturn``): the turns, their rendering, fingerprints."""

from __future__ import annotations

import pickle

import pytest

from gnll import GenerationConfig
from gnll.backends.base import ChatPrompt, chat_messages
from gnll.evaluation.data.datasets import Example
from gnll.evaluation.data.prompts import BRIEF_SHORT, build_messages, build_prompt
from gnll.evaluation.data.tasks import get_task

FEWSHOT = [
    Example("1", "Who wrote Hamlet?", ("Shakespeare",)),
    Example("2", "Capital of France?", ("Paris",), context=None),
]
QUESTION = Example("3", "Largest planet?", ("Jupiter",))


def test_messages_alternate_and_end_with_the_question():
    turns = build_messages(BRIEF_SHORT, FEWSHOT, QUESTION)
    assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant", "user"]
    assert turns[0]["content"] == f"{BRIEF_SHORT}\nQuestion: Who wrote Hamlet?\nAnswer:"
    assert [t["content"] for t in turns[1::2]] == ["Shakespeare", "Paris"]
    assert turns[-1]["content"] == "Question: Largest planet?\nAnswer:"


def test_svamp_turns_carry_the_context():
    ex = Example("4", "How many are left?", ("2",), context="Tom had 5 apples and ate 3.")
    turns = build_messages(BRIEF_SHORT, [ex], QUESTION)
    assert turns[0]["content"].endswith(
        "Context: Tom had 5 apples and ate 3.\nQuestion: How many are left?\nAnswer:"
    )


def test_chat_prompt_is_the_plain_text_and_keeps_its_turns():
    text = build_prompt(BRIEF_SHORT, FEWSHOT, QUESTION)
    p = ChatPrompt(text, build_messages(BRIEF_SHORT, FEWSHOT, QUESTION))
    assert p == text and isinstance(p, str)
    assert chat_messages(p) == build_messages(BRIEF_SHORT, FEWSHOT, QUESTION)
    assert chat_messages(text) == [{"role": "user", "content": text}]
    # string operations drop the turns; pickling (worker processes) keeps them
    assert not hasattr(p + "", "messages")
    assert pickle.loads(pickle.dumps(p)).messages == p.messages
    with pytest.raises(ValueError, match="at least one turn"):
        ChatPrompt("x", [])


def test_task_prompt_and_fingerprint():
    td = get_task("triviaqa_short").load(seed=0)  # the embedded sample
    ex = td.split("eval", 1)[0]
    single = td.prompt(ex)
    before = td.describe()
    td.fewshot_as_multiturn = True
    multi = td.prompt(ex)
    assert multi == single and not isinstance(single, ChatPrompt)
    assert len(multi.messages) == 11 and multi.messages[-1]["content"].endswith(
        ex.question + "\nAnswer:"
    )
    # a different format is a different run: resuming across formats must be refused
    assert td.describe() != before and td.describe()["fewshot_as_multiturn"] is True


@pytest.mark.model
def test_chat_model_renders_the_turns(smollm, monkeypatch):
    p = ChatPrompt(
        build_prompt(BRIEF_SHORT, FEWSHOT, QUESTION), build_messages(BRIEF_SHORT, FEWSHOT, QUESTION)
    )
    rendered = smollm.render_prompt(p)
    assert rendered.count("<|im_start|>user") == 3 and rendered.count("<|im_start|>assistant") == 3
    assert "<|im_start|>assistant\nShakespeare<|im_end|>" in rendered
    assert rendered.endswith(
        "Question: Largest planet?\nAnswer:<|im_end|>\n<|im_start|>assistant\n"
    )
    single = smollm.render_prompt(str(p))
    assert single.count("<|im_start|>user") == 1 and "Answer: Shakespeare" in single
    [[g]] = smollm.generate([p], GenerationConfig.greedy(max_new_tokens=8))
    assert g.token_ids and all(lp <= 0 for lp in g.token_logprobs)
    # a model without a chat template conditions on the text, turns or not
    monkeypatch.setattr(smollm, "chat_template", False)
    assert smollm.render_prompt(p) == str(p)
