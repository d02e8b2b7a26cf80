"""`gnll serve --model`: streamed answers go out while they are decoded, and put together they
equal the non-streamed response (text, log-probs, uncertainty); stop strings that span tokens and
characters split over tokens are held back; the `refuse` policy buffers."""

from __future__ import annotations

import copy
import json
import threading

import httpx
import openai
import pytest

from gnll.backends.held import HeldText
from gnll.policy import DEFAULT_REFUSAL
from gnll.serving import AbstentionPolicy, ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread

pytestmark = pytest.mark.model

STORY = [{"role": "user", "content": "Tell me a long story about a dragon."}]
FEW_SHOT = (
    "Question: What is 2+2?\nAnswer: 4\nQuestion: What colour is the sky?\nAnswer: blue\n"
    "Question: What is the capital of France?\nAnswer:"
)


class StepCounter:
    """Counts the decoding steps of the model's decoding loops (to tell when a chunk arrived
    relative to the decoding of its answer, whatever the machine's load)."""

    def __init__(self) -> None:
        self.steps = 0
        self.lock = threading.Lock()

    def wrap(self, model):
        view = copy.copy(model)
        opened = model.open_decoder

        def open_decoder(config, *, width=None):
            dec = opened(config, width=width)
            if dec is not None:
                step = dec.step

                def counted():
                    out = step()
                    with self.lock:
                        self.steps += 1
                    return out

                dec.step = counted
            return dec

        view.open_decoder = open_decoder
        return view


def serve(model, **settings):
    srv = ServerThread(build_inprocess_app(model, ServeSettings(**settings)))
    srv.__enter__()
    srv.client = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
    return srv


@pytest.fixture(scope="module")
def counted(smollm):
    counter = StepCounter()
    srv = serve(counter.wrap(smollm))
    srv.counter = counter
    yield srv
    srv.__exit__(None, None, None)


def uncertainty(choice):
    return choice.model_extra["uncertainty"]


def assert_close(got, want, path="uncertainty"):
    """Equal structure and non-float values; floats to 1e-4 (why: test_streamed_completion_with_logprobs...)."""
    if isinstance(want, dict):
        assert isinstance(got, dict) and got.keys() == want.keys(), path
        for k in want:
            assert_close(got[k], want[k], f"{path}.{k}")
    elif isinstance(want, list):
        assert isinstance(got, list) and len(got) == len(want), path
        for i, (g, w) in enumerate(zip(got, want, strict=True)):
            assert_close(g, w, f"{path}[{i}]")
    elif isinstance(want, float):
        assert got == pytest.approx(want, abs=1e-4), path
    else:
        assert got == want, path


def test_streamed_chat_equals_the_response_and_arrives_while_decoding(counted):
    kw = dict(model="smollm2-135m-instruct", messages=STORY, temperature=0, max_tokens=60)
    full = counted.client.chat.completions.create(logprobs=True, **kw).choices[0]
    assert full.finish_reason == "length"  # a long answer: 60 decoding steps
    seen, first_at, text, lps = [], None, [], []
    start = counted.counter.steps
    for chunk in counted.client.chat.completions.create(stream=True, logprobs=True, **kw):
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        if c.delta.content:
            if first_at is None:
                first_at = counted.counter.steps - start
            text.append(c.delta.content)
        if c.logprobs is not None:
            lps += [(e.token, e.logprob) for e in c.logprobs.content]
        seen.append(c)
    assert "".join(text) == full.message.content
    assert lps == [(e.token, e.logprob) for e in full.logprobs.content]
    assert seen[-1].finish_reason == "length"
    assert uncertainty(seen[-1]) == uncertainty(full)
    assert all("uncertainty" not in (c.model_extra or {}) for c in seen[:-1])
    # The first piece left the server while most of the answer was still to be decoded.
    assert first_at is not None and first_at < 30, first_at
    assert len(text) > 40  # one chunk per token, not one replayed block


def test_streamed_completion_with_logprobs_equals_the_response(counted):
    kw = dict(model="smollm2-135m-instruct", prompt=FEW_SHOT, temperature=0, max_tokens=30)
    for stop in (["Question:"], ["Answer: "], None):
        full = counted.client.completions.create(logprobs=0, stop=stop, **kw).choices[0]
        chunks = [
            x.choices[0]
            for x in counted.client.completions.create(stream=True, logprobs=0, stop=stop, **kw)
            if x.choices
        ]
        assert "".join(c.text for c in chunks) == full.text
        # Log-probs to float precision, not bitwise: a request that arrives before the decoding
        # loop of the one before it has ended joins that loop, and prefix caching then lays the
        # same prompt out differently (another summation order in the last bits).
        for field in ("tokens", "token_logprobs", "text_offset"):
            got = [v for c in chunks if c.logprobs for v in getattr(c.logprobs, field)]
            assert got == pytest.approx(getattr(full.logprobs, field), abs=1e-4), (stop, field)
        assert chunks[-1].finish_reason == full.finish_reason
        assert_close(uncertainty(chunks[-1]), uncertainty(full))
    assert "Question:" in full.text  # without the stop string the model goes on asking


def test_sampled_choices_stream_under_their_own_index(counted):
    kw = dict(
        model="smollm2-135m-instruct",
        messages=[{"role": "user", "content": "Name a colour."}],
        temperature=1.0,
        n=2,
        seed=7,
        max_tokens=12,
    )
    full = counted.client.chat.completions.create(**kw)
    texts = {0: "", 1: ""}
    last = {}
    for chunk in counted.client.chat.completions.create(stream=True, **kw):
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
            if c.finish_reason:
                last[c.index] = c
    assert [texts[i] for i in (0, 1)] == [c.message.content for c in full.choices]
    assert [uncertainty(last[i])["decoding"] for i in (0, 1)] == ["sampled", "sampled"]
    assert [uncertainty(last[i]) for i in (0, 1)] == [uncertainty(c) for c in full.choices]


def test_live_stream_has_no_uncertainty_headers_and_counts_metrics(counted):
    body = {
        "model": "smollm2-135m-instruct",
        "prompt": FEW_SHOT,
        "max_tokens": 8,
        "stop": ["\n"],
        "stream": True,
    }
    with httpx.stream("POST", counted.url + "/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        # Headers precede the body; the uncertainty is in the final chunk only.
        assert not [h for h in r.headers if h.lower().startswith("x-uncertainty")]
        lines = [ln for ln in r.iter_lines() if ln.startswith("data: ")]
    assert lines[-1] == "data: [DONE]"
    final = [json.loads(ln[6:]) for ln in lines[:-1] if '"uncertainty"' in ln]
    assert len(final) == 1 and final[0]["choices"][0]["uncertainty"]["g_nll"] > 0
    metrics = httpx.get(counted.url + "/metrics").text
    count = [ln for ln in metrics.splitlines() if ln.startswith("gnll_answer_g_nll_count")]
    assert count and float(count[0].split()[-1]) >= 1


@pytest.mark.parametrize("stream", [False, True])
def test_too_long_a_prompt_is_a_400_before_any_chunk(counted, stream):
    with pytest.raises(openai.BadRequestError) as err:
        counted.client.completions.create(
            model="smollm2-135m-instruct", prompt="word " * 9000, max_tokens=10, stream=stream
        )
    assert "context" in err.value.message and "max_new_tokens=10" in err.value.message


@pytest.mark.parametrize("threshold", [0.0, 1e9])
def test_refuse_policy_buffers_the_stream(smollm, threshold):
    counter = StepCounter()
    srv = serve(counter.wrap(smollm), policy=AbstentionPolicy(mode="refuse", threshold=threshold))
    try:
        kw = dict(model="smollm2-135m-instruct", messages=STORY, temperature=0, max_tokens=40)
        full = srv.client.chat.completions.create(**kw).choices[0]
        start, first_at, text = counter.steps, None, []
        for chunk in srv.client.chat.completions.create(stream=True, **kw):
            for c in chunk.choices:
                if c.delta.content:
                    first_at = counter.steps - start if first_at is None else first_at
                    text.append(c.delta.content)
                if c.finish_reason:
                    final = c
    finally:
        srv.__exit__(None, None, None)
    assert "".join(text) == full.message.content
    assert uncertainty(final) == uncertainty(full)
    assert first_at == counter.steps - start  # nothing before the whole answer was decoded
    if threshold == 0.0:
        assert full.message.content == DEFAULT_REFUSAL
        # Refused at its first token by an exact early decision (on by default): it ended there.
        assert final.finish_reason == "stop" and uncertainty(final)["refused"] is True
        assert uncertainty(final)["early"] is True and uncertainty(final)["decided_at_token"] <= 1
    else:
        assert final.finish_reason == "length" and "refused" not in uncertainty(final)


def test_held_text_never_sends_a_stop_string_or_half_a_character(smollm):
    tok = smollm.tokenizer
    rules = smollm.stop_rules(("Question:",))
    held = HeldText(tok.decode, rules.token_ids, rules.strings)
    ids = tok.encode(" Zürich 🐉 dragon\nQuestions\nQuestion: x", add_special_tokens=False)
    sent = []
    for i in ids:
        pieces = held.push(i, -0.1)
        sent.append("".join(p[0] for p in pieces))
        assert "\ufffd" not in sent[-1]
        assert "Question:" not in "".join(sent)
        for _text, tokens, lps in pieces:
            assert len(tokens) == len(lps) >= 1
    streamed = "".join(sent)
    # Everything before the stop string, except the newline that ends the text so far (trailing
    # whitespace waits for what follows it); "Questions" was held while it could still be the stop.
    assert streamed == " Zürich 🐉 dragon\nQuestions"
    assert sent[ids.index(tok.encode(" dragon", add_special_tokens=False)[0])].endswith("dragon")
    # The dragon's three byte tokens went out together, once the character was complete.
    assert any(p.endswith("🐉") for p in sent)
