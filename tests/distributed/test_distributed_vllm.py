"""The ``ray.data.llm`` vLLM processors on hand-built vLLM output rows (``vLLMOutputData``'s schema).

Rows are built from a real model's token log-probs (no GPU, no vLLM): given the very log-probs gnll
computed, the processors must give gnll's NLL, ``is_greedy``, ``greedy_stops`` and terminator split.
"""

from __future__ import annotations

import pytest
import torch

from gnll import load_model
from gnll import score as gnll_score
from gnll.backends.base import GenerationConfig
from gnll.distributed.vllm import VllmGreedy, VllmScoring
from gnll.evaluation.data.prompts import ask_prompt


def _position(logp: torch.Tensor, token: int, value: float, tok) -> dict:
    """vLLM's prompt_logprobs / logprobs entry: the token (rank, log-prob) and the top-1."""
    rank = int((logp > logp[token]).sum()) + 1
    top = int(torch.argmax(logp))
    entry = {token: {"logprob": value, "rank": rank, "decoded_token": tok.decode([token])}}
    if top != token:
        entry[top] = {"logprob": float(logp[top]), "rank": 1, "decoded_token": tok.decode([top])}
    return entry


def vllm_score_row(lm, request: dict, answer_logprobs: list[float]) -> dict:
    """What vLLM's stage returns for ``request`` (prompt + answer ids, prompt_logprobs=1,
    max_tokens=1 at temperature 0), the answer's log-probs replaced by ``answer_logprobs``."""
    ids = request["tokenized_prompt"]
    with torch.no_grad():
        logits = lm.model(torch.tensor([ids])).logits[0].float()
    logp = torch.log_softmax(logits, dim=-1)
    start = request["gnll_answer_start"]
    positions = [None]
    for t in range(1, len(ids)):
        v = answer_logprobs[t - start] if t >= start else float(logp[t - 1, ids[t]])
        positions.append(_position(logp[t - 1], ids[t], v, lm.tokenizer))
    nxt = int(torch.argmax(logp[-1]))
    keep = {k: v for k, v in request.items() if k not in ("tokenized_prompt", "sampling_params")}
    return {
        **keep,
        "prompt": lm.tokenizer.decode(ids),
        "prompt_token_ids": ids,
        "num_input_tokens": len(ids),
        "prompt_logprobs": positions,
        "generated_tokens": [nxt],
        "generated_text": lm.tokenizer.decode([nxt]),
        "num_generated_tokens": 1,
        "logprobs": [_position(logp[-1], nxt, float(logp[-1, nxt]), lm.tokenizer)],
    }


@pytest.fixture(scope="module")
def tiny(tiny_llama):
    return load_model(str(tiny_llama()), progress=False)


def greedy_answer(lm) -> tuple[str, str]:
    """A question and a greedy answer of ``lm`` that scores as greedy (verbatim): the model's own
    continuation, cut to the longest head that its tokenizer gives back token for token (a random
    tiny model's continuation need not be the canonical tokenisation of its text)."""
    for q in ("What is the capital of France?", "Who wrote Hamlet?", "What is 2 plus 2?"):
        [[g]] = lm.generate([ask_prompt(q, long=False)], GenerationConfig.greedy(max_new_tokens=6))
        for k in range(len(g.token_ids), 0, -1):
            head = lm.tokenizer.decode(g.token_ids[:k])
            [sc] = gnll_score(lm, [ask_prompt(q, long=False)], [head], verbatim=True)
            if sc.is_greedy:
                return q, head
    raise AssertionError("no greedy continuation of the tiny model survives retokenisation")


def test_scoring_postprocess_gives_gnll_scores(tiny):
    q = "What is the capital of France?"
    q_own, own = greedy_answer(tiny)
    rows = [
        ({"id": 0, "question": q, "answer": "Paris"}, False),
        ({"id": 1, "question": q_own, "answer": own}, True),
        ({"id": 2, "prompt": "2+2=", "answer": "4"}, False),
    ]
    seen_greedy = set()
    for row, verbatim in rows:
        vs = VllmScoring.from_model(tiny, verbatim=verbatim)
        request = vs.preprocess(row)
        assert request["sampling_params"]["prompt_logprobs"] == 1
        assert request["sampling_params"]["max_tokens"] == 1
        prompt = ask_prompt(row["question"], long=False) if "question" in row else row["prompt"]
        [local] = gnll_score(tiny, [prompt], [row["answer"]], verbatim=verbatim)
        got = vs.postprocess(vllm_score_row(tiny, request, local.token_logprobs))
        assert got["error"] is None and got["id"] == row["id"] and got["answer"] == row["answer"]
        assert abs(got["nll"] - local.nll) <= 1e-9 and got["num_tokens"] == local.num_tokens  # same path: the stand-in server returns these very log-probs
        assert abs(got["ln_nll"] - local.ln_nll) <= 1e-9  # same path: the stand-in server returns these very log-probs
        assert got["is_greedy"] == local.is_greedy
        assert got["greedy_stops"] == local.greedy_stops
        assert got["boundary_merged"] == local.boundary_merged
        assert "prompt_logprobs" not in got and "tokenized_prompt" not in got
        seen_greedy.add(local.is_greedy)
    assert seen_greedy == {True, False}  # both outcomes were checked


def test_scoring_bad_rows_get_the_error_of_gnll_score(tiny):
    vs = VllmScoring.from_model(tiny)
    request = vs.preprocess({"id": 7, "question": "Q?"})
    assert request["tokenized_prompt"]  # vLLM still gets a prompt
    row = {**request, "prompt_token_ids": request["tokenized_prompt"], "prompt_logprobs": [None]}
    got = vs.postprocess(row)
    assert got["error"] == "missing field 'answer'" and got["nll"] is None and got["id"] == 7
    ok = vs.preprocess({"id": 8, "question": "Q?", "answer": "yes"})
    ids = ok["tokenized_prompt"]
    sentinel = [None] + [{i: {"logprob": -9999.0, "rank": 9}} for i in ids[1:]]
    got = vs.postprocess({**ok, "prompt_token_ids": ids, "prompt_logprobs": sentinel})
    # the error gnll score gives (gnll.measures.check_logprobs), naming answer, token and value
    assert got["error"].startswith("cannot score: answer 'yes': token 0 ")
    assert (
        "has log-prob -9999.0" in got["error"] and "stand-in servers send for -inf" in got["error"]
    )
    assert got["nll"] is None


def vllm_greedy_row(lm, request: dict, gen) -> dict:
    """vLLM's output row of a greedy request whose tokens and log-probs are ``gen``'s."""
    ids = list(gen.token_ids) + list(gen.terminator_token_ids)
    values = list(gen.token_logprobs) + list(gen.terminator_logprobs)
    tok = lm.tokenizer
    return {
        **{k: v for k, v in request.items() if k not in ("tokenized_prompt", "sampling_params")},
        "prompt_token_ids": request["tokenized_prompt"],
        "generated_tokens": ids,
        # vLLM cuts the text before the stop string and leaves special tokens out
        "generated_text": tok.decode(gen.token_ids, skip_special_tokens=True),
        "num_generated_tokens": len(ids),
        "logprobs": [
            {i: {"logprob": v, "rank": 1, "decoded_token": tok.decode([i])}}
            for i, v in zip(ids, values, strict=True)
        ],
    }


def check_greedy(lm, questions: list[str], max_new_tokens: int) -> set[str]:
    vg = VllmGreedy.from_model(lm, max_new_tokens=max_new_tokens)
    finishes = set()
    for k, q in enumerate(questions):
        request = vg.preprocess({"id": k, "question": q})
        assert request["tokenized_prompt"] == lm.encode([ask_prompt(q, long=False)])[0]
        [[g]] = lm.generate(
            [ask_prompt(q, long=False)], GenerationConfig.greedy(max_new_tokens=max_new_tokens)
        )
        got = vg.postprocess(vllm_greedy_row(lm, request, g))
        assert got["error"] is None and got["answer"] == g.text
        assert abs(got["g_nll"] + g.logprob) <= 1e-9 and got["num_tokens"] == g.num_tokens
        assert got["finish_reason"] == g.finish_reason
        assert got["terminator_logprobs"] == g.terminator_logprobs
        finishes.add(g.finish_reason)
    return finishes


def test_greedy_postprocess_at_the_length_cap(tiny):
    assert check_greedy(tiny, ["What is 1+1?", "Name a colour."], 5) == {"length"}


@pytest.mark.model
def test_greedy_postprocess_splits_the_terminator_like_gnll(smollm):
    qs = ["What is the capital of France?", "Who wrote Hamlet?", "What is 2 + 2?"]
    assert "length" not in check_greedy(smollm, qs, 30)
