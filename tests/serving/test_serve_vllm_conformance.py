"""`gnll serve --upstream` in front of a real vLLM server (its CPU build, the run's ``vllm_server``)
on the embedded SmolLM2: the conformance matrix (chat and completions x stream or not x
``include_usage`` x every policy x early decisions), 8 concurrent SDK streams, early decisions that
make vLLM abort the request (its own log says so), the cascade to Gemma-3-270M on llama.cpp, and
agreement with in-process G-NLL on held-out questions."""

from __future__ import annotations

import contextlib
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from serve_helpers import QUESTIONS, check_escalated_early, concurrent_streams, sse
from test_serve_conformance import check_body, check_stream

from gnll import GenerationConfig
from gnll.backends.base import BATCH_INVARIANCE_ATOL
from gnll.serving import AbstentionPolicy, ServeSettings, build_proxy_app
from gnll.serving.server import ServerThread

pytestmark = pytest.mark.vllm

MODEL = "smollm2-135m-instruct"
#: Below the threshold or above it, on this model (measured, 12 tokens at most: G-NLL 2.6 and 12.5
#: on chat; 1.6 and 14.3 on completions, which stop at a newline).
THRESHOLD = 6.0
PROMPTS = {
    (True, "sure"): "What is the capital of France?",
    (True, "unsure"): "Write a poem about a purple frog.",
    (
        False,
        "sure",
    ): "Answer the question concisely.\nQuestion: What is the capital of France?\nAnswer:",
    (False, "unsure"): "Once upon a time",
}
MAX_TOKENS = 12
REFUSAL = "I do not know."
#: policy id -> (policy mode, early), in front of the real vLLM server
POLICIES = {
    "annotate": ("annotate", None),
    "flag": ("flag", None),
    "refuse": ("refuse", None),
    "refuse-early": ("refuse", True),
    "escalate": ("escalate", None),  # a proxy escalates early by default (vLLM streams usage)
    "escalate-late": ("escalate", False),
}
COUNTS = ("prompt_tokens", "completion_tokens", "total_tokens")
LARGER = "smollm2-gguf"  # the escalation target's name: SmolLM2's GGUF on llama.cpp


@pytest.fixture(scope="module")
def larger(tmp_path_factory):
    """The escalation target of the matrix: a llama.cpp server (starts in seconds)."""
    from gnll.backends.embedded import EMBEDDED_MODELS
    from gnll.backends.openai.launch import LlamaServer

    gguf = EMBEDDED_MODELS[MODEL].gguf(tmp_path_factory.mktemp("gguf"))
    with LlamaServer(gguf, LARGER, lifetime=3600) as server:
        yield server


@pytest.fixture(scope="module")
def proxies(vllm_server, larger):
    """policy id -> a proxy in front of the real vLLM server."""
    with contextlib.ExitStack() as stack:
        out = {}
        for pid, (mode, early) in POLICIES.items():
            policy = AbstentionPolicy(
                mode=mode,
                threshold=None if mode == "annotate" else THRESHOLD,
                refusal=REFUSAL,
            )
            settings = ServeSettings(policy=policy, early=early, upstream_timeout=600)
            escalate = {"escalate_to": larger.base_url, "escalate_model": LARGER}
            app = build_proxy_app(
                vllm_server.base_url, settings, **(escalate if mode == "escalate" else {})
            )
            srv = stack.enter_context(ServerThread(app))
            srv.policy_id, srv.mode = pid, mode
            out[pid] = srv
        yield out


def post(srv, path: str, **body) -> httpx.Response:
    return httpx.post(srv.url + "/v1" + path, json={"model": MODEL, **body}, timeout=600)


def request(chat: bool, which: str) -> tuple[str, dict]:
    prompt = PROMPTS[(chat, which)]
    if chat:
        return "/chat/completions", {"messages": [{"role": "user", "content": prompt}]}
    return "/completions", {"prompt": prompt, "stop": ["\n"]}


def text_of(choice: dict, chat: bool) -> str:
    return choice["message"]["content"] if chat else choice["text"]


@pytest.mark.parametrize("policy", list(POLICIES))
@pytest.mark.parametrize("chat", [False, True], ids=["completions", "chat"])
def test_every_policy_answers_as_openai_does(proxies, chat, policy):
    """Bodies and every stream chunk validate with the openai types; each choice finishes once;
    the usage chunk comes only when asked for, with the body's usage; a stream says what the body
    says; each policy does what it says on the uncertain answer and leaves the sure one alone."""
    srv = proxies[policy]
    for which in ("sure", "unsure"):
        path, kw = request(chat, which)
        body = post(srv, path, max_tokens=MAX_TOKENS, **kw)
        assert body.status_code == 200, body.text
        check_body(body.json(), chat)
        choice = body.json()["choices"][0]
        u, usage = choice["uncertainty"], body.json()["usage"]
        mine = u["local"] if u.get("escalated") else u  # SmolLM2's answer on vLLM
        assert (mine["g_nll"] > THRESHOLD) is (which == "unsure"), (which, mine)
        _check_policy(srv, choice, chat, which)
        assert usage["prompt_tokens"] > 0 and usage["completion_tokens"] > 0, usage
        if u.get("early"):  # cut at the decision: the tokens the proxy received before it
            assert usage["completion_tokens"] == u["tokens_generated"], (usage, u)
        for include_usage in (False, True):
            opts = {"stream_options": {"include_usage": True}} if include_usage else {}
            r = post(srv, path, stream=True, max_tokens=MAX_TOKENS, **kw, **opts)
            assert r.status_code == 200, r.text
            chunks = check_stream(sse(r.text), chat, usage=include_usage, counted=usage is not None)
            if include_usage and usage is not None:  # the counts (vLLM adds null details to bodies)
                assert {k: chunks[-1]["usage"][k] for k in COUNTS} == {k: usage[k] for k in COUNTS}
            streamed = "".join(
                (c["choices"][0]["delta"].get("content") or "") if chat else c["choices"][0]["text"]
                for c in chunks
                if c["choices"]
            )
            assert streamed == text_of(choice, chat)
            final = [c for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
            # another request of vLLM's (a cached prefix, another batch): the same answer, its
            # log-probs within the documented tolerance per token
            assert final[-1]["choices"][0]["uncertainty"]["g_nll"] == pytest.approx(
                u["g_nll"], abs=MAX_TOKENS * BATCH_INVARIANCE_ATOL
            )


def _check_policy(srv, choice: dict, chat: bool, which: str) -> None:
    u, unsure = choice["uncertainty"], which == "unsure"
    mode, early = POLICIES[srv.policy_id]
    if mode == "annotate":
        assert "abstain" not in u or not u["abstain"]
        return
    if mode == "escalate":
        assert u["escalated"] is unsure, u
        if unsure:  # the larger model's answer, with SmolLM2's record under "local"
            assert u["answered_by"] == LARGER and u["local"]["model"] == MODEL
            assert bool(u["local"].get("early")) is (early is None), u["local"]
        else:
            assert u["abstain"] is False
        return
    assert u["abstain"] is unsure, u
    if mode == "flag":
        assert text_of(choice, chat)  # said anyway, flagged
    if mode == "refuse":
        assert (text_of(choice, chat) == REFUSAL) is unsure
        assert bool(u.get("early")) is (unsure and early is True)


def test_every_policy_passes_the_sdks_canonical_loops(proxies):
    """``for chunk in stream: chunk.choices[0]`` (the openai SDK's README loop), sync and async,
    through every policy's proxy."""
    for pid, srv in proxies.items():
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=600)
        text = "".join(
            chunk.choices[0].delta.content or ""
            for chunk in c.chat.completions.create(
                model=MODEL,
                messages=[{"role": "user", "content": PROMPTS[(True, "unsure")]}],
                max_tokens=MAX_TOKENS,
                stream=True,
            )
        )
        mode = POLICIES[pid][0]
        if mode == "refuse":
            assert text == REFUSAL
        else:
            assert text, pid
        pieces = [
            chunk.choices[0].text
            for chunk in c.completions.create(
                model=MODEL,
                prompt=PROMPTS[(False, "sure")],
                max_tokens=MAX_TOKENS,
                stop=["\n"],
                stream=True,
            )
        ]
        assert "Paris" in "".join(pieces), pid


def test_eight_concurrent_sdk_streams_all_finish(proxies, vllm_server):
    """8 chat streams at once (AsyncOpenAI, the canonical loop): each ends with one finish_reason
    and its uncertainty, and says what the same request says unstreamed."""

    srv = proxies["annotate"]
    started = time.perf_counter()
    results = concurrent_streams(srv.url, MODEL, MAX_TOKENS, timeout=600)
    print(f"8 concurrent streams through the proxy to vLLM: {time.perf_counter() - started:.1f} s")
    for q, r in zip(QUESTIONS, results, strict=True):
        assert r["finishes"] == 1 and len(r["uncertainty"]) == 1 and r["text"], r
        whole = post(
            srv, "/chat/completions", messages=[{"role": "user", "content": q}], max_tokens=12
        ).json()["choices"][0]
        assert r["text"] == whole["message"]["content"]
        # vLLM batched the 8 streams; one request alone agrees at the documented tolerance per
        # token (the answers are at most 12 tokens)
        assert r["uncertainty"][0]["g_nll"] == pytest.approx(
            whole["uncertainty"]["g_nll"], abs=MAX_TOKENS * BATCH_INVARIANCE_ATOL
        )


STORY = "Write a long story about a dragon who learns to cook. Chapter 1:"


def _request_ids(log: str, max_tokens: int) -> list[str]:
    """The ids vLLM logged for the requests asking for ``max_tokens`` (a value only one test uses)."""
    return re.findall(rf"Received request (\S+): params: .*\bmax_tokens={max_tokens}\b", log)


def test_an_early_decision_makes_vllm_abort_the_request(vllm_server):
    """Under ``refuse --early`` the proxy decides a few tokens into a request for up to 397
    tokens and closes vLLM's stream: vLLM aborts the request (its own log: ``Aborted request(s)
    <id>``) instead of finishing it."""
    max_tokens = 397  # names this test's request in vLLM's log
    policy = AbstentionPolicy(mode="refuse", threshold=4.0)
    app = build_proxy_app(vllm_server.base_url, ServeSettings(policy=policy, early=True))
    seen = len(vllm_server.log())  # the log so far: earlier runs' lines (a developer's server)
    with ServerThread(app) as px:
        r = post(px, "/completions", prompt=STORY, max_tokens=max_tokens)
    assert r.status_code == 200, r.text
    u = r.json()["choices"][0]["uncertainty"]
    assert u["early"] is True and u["refused"] is True and u["decided_at_token"] < 50, u
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        log = vllm_server.log()[seen:]
        [rid] = _request_ids(log, max_tokens)
        aborted = re.search(rf"Aborted request\(s\) [^\n]*{re.escape(rid)}", log)
        if aborted:
            break
        time.sleep(0.5)
    assert aborted, f"vLLM did not abort {rid}:\n" + "\n".join(
        line for line in log.splitlines() if rid in line
    )
    assert f"Request {rid} aborted." in log
    # Control: the answer does not end by itself soon after the decision (it runs on past 60
    # tokens), so ending there was the abort.
    whole = httpx.post(
        vllm_server.base_url + "/completions",
        json={"model": MODEL, "prompt": STORY, "max_tokens": 60, "temperature": 0},
        timeout=600,
    ).json()
    assert whole["usage"]["completion_tokens"] == 60 > u["decided_at_token"] + 10


def test_the_cascade_escalates_from_vllm_to_gemma_on_llamacpp(vllm_server, tmp_path_factory):
    """SmolLM2 on the real vLLM answers first; where its G-NLL passes the threshold, the proxy cuts
    vLLM's stream at the exact decision (vLLM aborts the request) and Gemma-3-270M on llama.cpp
    answers instead; a sure answer stays SmolLM2's."""
    from gnll.backends.embedded import EMBEDDED_MODELS
    from gnll.backends.openai.launch import LlamaServer

    gguf = EMBEDDED_MODELS["gemma-3-270m"].gguf(tmp_path_factory.mktemp("gemma-gguf"))
    max_tokens = 41  # names this test's requests in vLLM's log
    policy = AbstentionPolicy(mode="escalate", threshold=3.0)
    seen = len(vllm_server.log())
    # A context just long enough: llama-cpp-python turns its whole logit buffer (context x 262k
    # vocabulary) into log-probs as it generates.
    with LlamaServer(gguf, "gemma-3-270m", n_ctx=96, lifetime=1200) as gemma:
        app = build_proxy_app(
            vllm_server.base_url,
            ServeSettings(policy=policy, upstream_timeout=600),
            escalate_to=gemma.base_url,
        )
        with ServerThread(app) as px:
            r = post(px, "/completions", prompt=STORY, max_tokens=max_tokens)
            _, kw = request(False, "sure")
            sure = post(px, "/completions", max_tokens=12, **kw)
    check_escalated_early(r, local_model=MODEL, max_tokens=max_tokens)
    s = sure.json()["choices"][0]
    assert s["uncertainty"]["escalated"] is False and "Paris" in s["text"]
    assert sure.headers["x-answered-by"] == MODEL
    log = vllm_server.log()[seen:]
    [rid] = _request_ids(log, max_tokens)
    deadline = time.monotonic() + 30
    while f"Request {rid} aborted." not in log and time.monotonic() < deadline:
        time.sleep(0.5)
        log = vllm_server.log()[seen:]
    assert f"Request {rid} aborted." in log, "vLLM kept generating the escalated answer"


@pytest.mark.model
def test_proxy_gnll_agrees_with_in_process_on_held_out_questions(proxies, smollm):
    """40 held-out TriviaQA questions (the paper's few-shot prompt) as chat requests through the
    proxy to vLLM, and in-process on the same weights: the same greedy answers, and per token the
    same log-probs within the documented tolerance (so G-NLL within it times the answer length).
    Measured (CPU build 0.32.0): 40 of 40 equal, max |dG-NLL| 2.8e-4 over up to 32 tokens, max
    per-token |d| 2.9e-5."""
    from gnll.evaluation.data.tasks import get_task

    td = get_task("triviaqa_short").load(seed=0)
    prompts = [td.prompt(ex) for ex in td.split("heldout", 40)]
    cfg = GenerationConfig.greedy(max_new_tokens=32)
    local = [g[0] for g in smollm.generate(prompts, cfg)]
    srv = proxies["annotate"]

    def ask(prompt: str) -> dict:
        messages = [{"role": "user", "content": prompt}]
        r = post(srv, "/chat/completions", messages=messages, max_tokens=32,
                 stop=list(cfg.stop), logprobs=True)  # fmt: skip
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]

    with ThreadPoolExecutor(max_workers=8) as pool:
        served = list(pool.map(ask, prompts))
    equal, worst, worst_token = 0, 0.0, 0.0
    for g, c in zip(local, served, strict=True):
        assert c["message"]["content"].strip() == g.text.strip(), (g.text, c["message"])
        equal += 1
        # vLLM's chat log-probs also cover the end-of-sequence token that ended an answer; G-NLL
        # leaves it out, and in-process keeps it as the terminator
        lps = [t["logprob"] for t in c["logprobs"]["content"]]
        n = len(g.token_logprobs)
        assert len(lps) in (n, n + len(g.terminator_logprobs)), (len(lps), g)
        ours = [*g.token_logprobs, *g.terminator_logprobs][: len(lps)]
        worst_token = max([worst_token, *(abs(a - b) for a, b in zip(lps, ours, strict=True))])
        d = abs(c["uncertainty"]["g_nll"] - (-sum(g.token_logprobs)))
        assert d <= max(1, n) * BATCH_INVARIANCE_ATOL, (g.text, d)
        worst = max(worst, d)
    print(
        f"proxy vs in-process: {equal}/40 equal, max |dG-NLL| {worst:.2g}, per token {worst_token:.2g}"
    )
    assert worst_token <= BATCH_INVARIANCE_ATOL
