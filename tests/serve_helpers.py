"""A scripted stand-in model for the server tests that check plumbing, not a language model."""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from typing import Literal

from openai.types import Completion
from openai.types.completion_choice import CompletionChoice

from gnll.backends.base import Capabilities, Generation, Model

#: Debian's Chromium, driven by Playwright in the browser tests.
CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
]


@contextlib.contextmanager
def chromium():
    """:data:`CHROMIUM`, headless through Playwright: the browser, closed when the block ends."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        try:
            yield browser
        finally:
            browser.close()


def ask_on_page(page, question: str, timeout: float = 60_000) -> None:
    """Type ``question`` on the page, ask, and wait (``timeout`` ms) until its answer is done."""
    page.fill("#question", question)
    page.click("#ask")
    page.wait_for_selector("#answer[data-state=done]", timeout=timeout)


#: prompt -> (answer tokens, their log-probs); other prompts get SURE.
SURE = (["Paris", "."], [-0.01, -0.02])
UNSURE = (["Maybe", " Lyon"], [-2.0, -3.0])
SCRIPT = {"unsure": UNSURE}


class ScriptedModel(Model):
    """Answers from :data:`SCRIPT`; records every ``generate`` call's batch size."""

    capabilities = Capabilities()  # beams, scoring, terminator, tempered log-probs

    name = "scripted"

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.calls: list[int] = []
        self.configs: list = []
        self.prompts: list[str] = []
        self.lock = threading.Lock()

    def render_prompt(self, prompt: str) -> str:
        return prompt

    def generate(self, prompts, config=None, **kwargs):
        with self.lock:
            self.calls.append(len(prompts))
            self.prompts.extend(prompts)
            self.configs.append(config)
        if self.delay:
            time.sleep(self.delay)
        out = []
        for p in prompts:
            tokens, lps = SCRIPT.get(p.strip(), SURE)
            n = config.num_sequences if config is not None else 1
            out.append(
                [
                    Generation(
                        "".join(tokens).strip(),
                        list(range(len(tokens))),
                        list(tokens),
                        list(lps),
                        "eos",
                    )
                    for _ in range(n)
                ]
            )
        return out

    def score(self, prompts, answers, **kwargs):
        raise NotImplementedError("the scripted model only generates")


#: A long answer (for streams that a client abandons): 200 one-word tokens.
LONG = ([f" w{i}" for i in range(200)], [-0.5] * 200)
STREAM_SCRIPT = {**SCRIPT, "long": LONG}
EOS = 0


class _Tokenizer:
    def __init__(self, vocab: dict[int, str]) -> None:
        self.vocab = vocab

    def decode(self, ids) -> str:
        return "".join(self.vocab[i] for i in ids)

    def __call__(self, text: str) -> dict:
        return {"input_ids": list(range(len(text.split())))}


class _StopRules:
    def __init__(self, stop) -> None:
        self.token_ids, self.strings, self.stop = {EOS}, tuple(stop), tuple(stop)


class FakeDecoder:
    """The continuous decoding loop's interface (``add``/``step``/``busy``/``cancel``) over
    scripted answers, one token per row per step, ``width`` rows at a time, ``delay`` s a step."""

    def __init__(self, model: StreamingModel, config, width: int) -> None:
        self.model, self.config, self.width = model, config, width
        self.waiting: list = []
        self.rows: dict = {}  # (tag, j) -> [tokens, position, max_new]
        self.results: dict = {}
        self.on_token = None
        self.top_k = 0
        self.top_logprobs: dict = {}
        self.n = config.num_sequences

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.rows)

    def add(
        self, tag, ids, prefix=None, *, seed=None, max_new_tokens=None, stops=None, watch=None
    ) -> None:
        prompt = "".join(chr(i) for i in ids).strip()
        script = STREAM_SCRIPT.get(prompt, SURE)
        self.results[tag] = [None] * self.n
        self.waiting.append((tag, script, max_new_tokens or self.config.max_new_tokens, watch))

    def cancel(self, tag) -> None:
        self.model.cancelled.append(tag)
        self.waiting = [w for w in self.waiting if w[0] != tag]
        self.results.pop(tag, None)
        for key in [k for k in self.rows if k[0] == tag]:
            del self.rows[key]

    def step(self):
        while self.waiting and len(self.rows) + self.n <= self.width:
            tag, script, cap, watch = self.waiting.pop(0)
            for j in range(self.n):
                self.rows[(tag, j)] = [script, 0, cap, watch]
        time.sleep(self.model.delay)
        self.model.steps.append(sorted({k[0] for k in self.rows}))
        heard, done = [], []
        for (tag, j), row in list(self.rows.items()):
            (tokens, lps), t, cap, watch = row
            token = self.model.ids[tokens[t]] if t < len(tokens) else EOS
            lp = lps[t] if t < len(tokens) else -0.1
            # the step's alternatives, as the answer's top_logprobs list them below
            step_alts = None
            if self.top_k:
                step_alts = {tokens[t]: lp, " else": lp - 1.0} if t < len(tokens) else {"": lp}
            heard.append((tag, j, token, lp, step_alts))
            row[1] = t + 1
            self.model.generated += 1
            decided = watch is not None and watch(j, token, lp)  # an early decision ends it
            if decided or token == EOS or row[1] >= cap:
                k = min(row[1], len(tokens))
                ended = "eos" if token == EOS else "length"
                gen = Generation(
                    "".join(tokens[:k]).strip(),
                    [self.model.ids[x] for x in tokens[:k]],
                    list(tokens[:k]),
                    list(lps[:k]),
                    ended,
                    terminator_token_ids=[EOS] if ended == "eos" else [],
                    terminator_logprobs=[-0.1] if ended == "eos" else [],
                )
                self.results[tag][j] = gen
                if self.top_k:
                    alts = self.top_logprobs.setdefault(tag, [None] * self.n)
                    alts[j] = [
                        {tok: lp, " else": lp - 1.0}
                        for tok, lp in zip(tokens[:k], lps[:k], strict=True)
                    ]
                del self.rows[(tag, j)]
                if all(g is not None for g in self.results[tag]):
                    done.append((tag, self.results.pop(tag)))
        if self.on_token is not None:
            self.on_token(heard)
        return done


class StreamingModel(ScriptedModel):
    """:class:`ScriptedModel` with a decoding loop (``open_decoder``), as the hf backend has: the
    engine batches continuously, streams token by token and reports alternatives."""

    name = "streaming"
    capabilities = Capabilities(beams=False, scoring=False, streaming=True)

    def __init__(self, delay: float = 0.002) -> None:
        super().__init__(delay=0.0)
        self.delay = delay
        words = sorted({w for toks, _ in STREAM_SCRIPT.values() for w in toks} | set(SURE[0]))
        self.ids = {w: i + 1 for i, w in enumerate(words)}
        self.tokenizer = _Tokenizer({EOS: "", **{i: w for w, i in self.ids.items()}})
        self.steps: list[list] = []
        self.cancelled: list = []
        self.generated = 0  # tokens decoded, all rows

    def encode(self, prompts, raw_prompt: bool = False) -> list[list[int]]:
        return [[ord(c) for c in p] for p in prompts]

    def check_context(self, ids, max_new_tokens: int) -> None:
        if any(len(row) > 4000 for row in ids):
            raise ValueError("the prompt is longer than the model's context")

    def decode(self, token_ids) -> str:
        return self.tokenizer.decode(token_ids)

    def stop_rules(self, stop) -> _StopRules:
        return _StopRules(stop)

    def open_decoder(self, config, *, width=None) -> FakeDecoder:
        return FakeDecoder(self, config, width or 1)


class StreamedChoice(CompletionChoice):
    # OpenAI's own streamed completions carry finish_reason null until the last chunk; the SDK
    # types them as Completion all the same.
    finish_reason: Literal["stop", "length", "content_filter"] | None = None


class StreamedCompletion(Completion):
    choices: list[StreamedChoice]


def sse(text: str) -> list:
    """The events of a server-sent-event body, ``[DONE]`` included as a string."""
    out = []
    for line in text.splitlines():
        if line.startswith("data: "):
            payload = line[6:]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


def otel_events(exp) -> list[dict]:
    """The attributes of each event the ``otel`` fixture's exporter caught, each asserted to be
    gnll's evaluation event."""
    from gnll.serving.tracing import EVENT_NAME

    out = []
    for item in exp.get_finished_logs():
        rec = getattr(item, "log_record", item)
        assert rec.event_name == EVENT_NAME
        out.append(dict(rec.attributes))
    return out


@contextlib.contextmanager
def access_log(caplog):
    """Capture the access log (``gnll serve``'s own set-up stops it from propagating)."""
    logger = logging.getLogger("gnll.serve.access")
    was, logger.propagate = logger.propagate, True
    try:
        with caplog.at_level(logging.INFO, logger="gnll.serve.access"):
            yield
    finally:
        logger.propagate = was


class NoLoopModel(StreamingModel):
    """The hooks of :class:`StreamingModel` (a tokenizer), but no decoding loop that serves
    (``capabilities.streaming`` false, as a sliding-window model such as Gemma): the engine
    decodes whole batches and streams are replays; usage still counts the prompt's tokens."""

    name = "scripted"
    capabilities = Capabilities(beams=False, scoring=False, streaming=False)


#: A reasoning stand-in's trace (:class:`Thinker`): 30 tokens of NLL 1 each, past any threshold
#: the tests use, so a decision that counted trace tokens would be made inside the trace.
THOUGHTS = ([f" t{i}" for i in range(30)], [-1.0] * 30)


class _ThinkingDecoder(FakeDecoder):
    """:class:`FakeDecoder` for :class:`Thinker`: a prompt that opens a trace (``…<think>\\n``)
    decodes :data:`THOUGHTS`; an answer's context (``question<think>\\n… </think>…``) decodes the
    question's script."""

    def add(
        self, tag, ids, prefix=None, *, seed=None, max_new_tokens=None, stops=None, watch=None
    ) -> None:
        question, _, rest = "".join(chr(i) for i in ids).partition("<think>")
        script = STREAM_SCRIPT.get(question.strip(), SURE) if "</think>" in rest else THOUGHTS
        self.model.contexts.append("".join(chr(i) for i in ids))
        self.results[tag] = [None] * self.n
        self.waiting.append((tag, script, max_new_tokens or self.config.max_new_tokens, watch))


class Thinker(StreamingModel):
    """The model a stand-in reasoning model runs (``ReasoningModel(Thinker())``): traces are
    :data:`THOUGHTS`, answers :data:`STREAM_SCRIPT`'s; its ``generate`` is its decoding loop run
    to the end, so answers decoded with and without early decisions agree."""

    name = "thinker"

    def __init__(self, delay: float = 0.0) -> None:
        super().__init__(delay=delay)
        for w in THOUGHTS[0]:
            self.ids.setdefault(w, len(self.ids) + 1)
        self.tokenizer = _Tokenizer({EOS: "", **{i: w for w, i in self.ids.items()}})
        self.contexts: list[str] = []  # every prompt the loop decoded (heads and contexts)

    def open_decoder(self, config, *, width=None) -> FakeDecoder:
        return _ThinkingDecoder(self, config, width or 1)

    def generate(self, prompts, config=None, **kw):
        from gnll.backends.base import GenerationConfig

        config = config or GenerationConfig.greedy()
        dec = self.open_decoder(config, width=len(prompts) * config.num_sequences)
        for i, row in enumerate(self.encode(prompts)):
            dec.add(i, row, max_new_tokens=config.max_new_tokens)
        done: dict = {}
        while dec.busy:
            done.update(dec.step())
        return [done[i] for i in range(len(prompts))]


def serve(model: Model, **settings):
    """``gnll serve --model`` around ``model`` in a thread (settings: :class:`ServeSettings`)."""
    from gnll.serving import ServeSettings, build_inprocess_app
    from gnll.serving.server import ServerThread

    return ServerThread(build_inprocess_app(model, ServeSettings(**settings), max_wait_ms=5))


@contextlib.contextmanager
def escalating(
    small: Model,
    big: Model,
    settings,
    *,
    max_wait_ms: int = 5,
    escalate_model: str | None = None,
):
    """``small`` served in-process with ``settings`` (:class:`ServeSettings` whose policy
    escalates), escalating to ``big`` served in-process on loopback (``escalate_model``: the name
    it is asked for); both servers stop when the block ends."""
    from gnll.serving import ServeSettings, build_inprocess_app
    from gnll.serving.server import ServerThread

    with ServerThread(build_inprocess_app(big, ServeSettings(), max_wait_ms=max_wait_ms)) as up:
        app = build_inprocess_app(
            small,
            settings,
            max_wait_ms=max_wait_ms,
            escalate_to=up.url + "/v1",
            escalate_model=escalate_model,
        )
        with ServerThread(app) as local:
            yield local


def check_refused_early(on: dict, off: dict) -> tuple[dict, dict]:
    """The "long" prompt's choices (its answer is :data:`LONG`, log-prob -0.5 a token) under
    refuse at threshold 3.0, with early decisions (``on``) and without (``off``): both refused,
    the early one decided at the answer's 7th token (G-NLL 3.5 > 3.0), a lower bound. Returns the
    two records."""
    from gnll.policy import DEFAULT_REFUSAL

    assert on["text"] == off["text"] == DEFAULT_REFUSAL
    u_on, u_off = on["uncertainty"], off["uncertainty"]
    assert u_on["abstain"] is u_off["abstain"] is True
    assert u_on["early"] is True and u_on["decided_at_token"] == 7
    assert u_on["g_nll"] == 3.5 and u_on["g_nll_is_lower_bound"] is True
    return u_on, u_off


def ask(srv, prompt: str, max_tokens: int = 100) -> dict:
    """One ``/v1/completions`` request's first choice (a 200 is asserted)."""
    import httpx

    r = httpx.post(
        srv.url + "/v1/completions",
        json={"prompt": prompt, "max_tokens": max_tokens},
        timeout=60,
    )
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]


def check_escalated_early(
    r, *, local_model: str, max_tokens: int, answered_by: str = "gemma-3-270m"
):
    """The record of a real cascade's escalated ``/v1/completions`` answer (``r``, an httpx
    response): answered by ``answered_by`` (record and header), the local model cut at its exact
    early decision within its first 10 tokens. Returns the record's ``local`` part."""
    assert r.status_code == 200, r.text
    choice = r.json()["choices"][0]
    u = choice["uncertainty"]
    assert u["escalated"] is True and u["answered_by"] == answered_by, u
    assert r.headers["x-answered-by"] == answered_by and choice["text"]
    local = u["local"]
    assert local["early"] is True and local["model"] == local_model
    assert local["decided_at_token"] <= 10 and local["tokens_saved"] >= max_tokens - 10
    return local


def check_withheld_call(r, stream: bool) -> tuple[dict, dict]:
    """A chat reply (``r``, an httpx response) whose one call, to get_weather, was withheld: no
    call reached it (no ``tool_calls`` delta or field, no log-probs) and its text says so. Returns
    the call's record and the choice's."""
    if stream:
        events = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
        deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
        assert not any(d.get("tool_calls") for d in deltas)
        text = "".join(d.get("content") or "" for d in deltas)
        record = events[-1]["choices"][0]["uncertainty"]
    else:
        choice = r.json()["choices"][0]
        assert "tool_calls" not in choice["message"] and choice["logprobs"] is None
        text, record = choice["message"]["content"], choice["uncertainty"]
    assert "withheld: get_weather (call 0)" in text
    [rec] = record["tool_calls"]
    assert rec["withheld"] is True
    return rec, record


#: Eight short questions, asked at once by the concurrent-stream tests (llama.cpp, vLLM).
QUESTIONS = [
    "What is the capital of France?",
    "Who wrote Hamlet?",
    "How many legs does a spider have?",
    "What is the largest planet?",
    "Which river flows through Vienna?",
    "What colour is the sky?",
    "Who painted the Mona Lisa?",
    "What is 2 + 2?",
]


def concurrent_streams(url: str, model: str, max_tokens: int, timeout: float = 300) -> list[dict]:
    """:data:`QUESTIONS` as chat streams at once through the openai SDK (AsyncOpenAI), each read
    with the canonical loop: its text, finishing chunks, uncertainty objects, or the error it
    raised."""
    import asyncio

    import openai

    async def one(c: openai.AsyncOpenAI, q: str) -> dict:
        out: dict = {"text": "", "finishes": 0, "uncertainty": [], "error": None}
        try:
            stream = await c.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": q}],
                max_tokens=max_tokens,
                stream=True,
            )
            async for chunk in stream:
                choice = chunk.choices[0]
                out["text"] += choice.delta.content or ""
                out["finishes"] += choice.finish_reason is not None
                if getattr(choice, "uncertainty", None):
                    out["uncertainty"].append(choice.uncertainty)
        except openai.APIError as exc:
            out["error"] = str(exc)
        return out

    async def main() -> list[dict]:
        c = openai.AsyncOpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=timeout)
        return await asyncio.gather(*(one(c, q) for q in QUESTIONS))

    return asyncio.run(main())


def chat_entries(tokens: list[tuple[str, float]]) -> list[dict]:
    """``logprobs.content`` entries of an upstream stand-in's chat answer."""
    return [
        {"token": t, "logprob": lp, "bytes": list(t.encode()), "top_logprobs": []}
        for t, lp in tokens
    ]


def chat_whole(base: dict, content: list[dict], text: str, usage: dict) -> dict:
    """An upstream stand-in's whole chat answer (one choice, finished by ``stop``)."""
    choice = {
        "index": 0,
        "message": {"role": "assistant", "content": text},
        "logprobs": {"content": content},
        "finish_reason": "stop",
    }
    return {**base, "object": "chat.completion", "choices": [choice], "usage": usage}


def chat_pieces(kind: dict, content: list[dict]) -> list[str]:
    """An upstream stand-in's chat stream events: one token per chunk, then the finish chunk (no
    ``[DONE]``)."""
    out = []
    for entry in content:
        piece = {
            "index": 0,
            "delta": {"content": entry["token"]},
            "logprobs": {"content": [entry]},
            "finish_reason": None,
        }
        out.append(f"data: {json.dumps({**kind, 'choices': [piece]})}\n\n")
    end = {"index": 0, "delta": {}, "finish_reason": "stop"}
    out.append(f"data: {json.dumps({**kind, 'choices': [end]})}\n\n")
    return out
