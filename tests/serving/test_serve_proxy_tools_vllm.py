"""Tool calls and structured output through ``gnll serve --upstream`` in front of a real vLLM (the
run's shared ``vllm_server``: vLLM's CPU build on the embedded SmolLM2, started with
``--enable-auto-tool-choice --tool-call-parser hermes`` and SmolLM2's template extended with gnll's
tool prompt, :func:`gnll.toolcalls.tool_chat_template`), through the official openai SDK.

vLLM returns a call in ``message.tool_calls`` and its tokens in ``logprobs.content``; the proxy
finds each call in those tokens. Its per-call, per-name and per-argument NLLs must equal a
teacher-forced ``gnll score`` (in-process hf backend) of the same output within the documented
tolerance (``BATCH_INVARIANCE_ATOL`` per token); the parts partition the call; under ``refuse`` a
withheld call leaks no byte, stream and not; what vLLM refuses comes back as vLLM's error, named.

Before, every request with ``tools`` or a JSON ``response_format`` was a 400 from the proxy.
"""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import openai
import pytest
from serve_helpers import check_withheld_call
from typer.testing import CliRunner

from gnll.backends.base import BATCH_INVARIANCE_ATOL, ChatPrompt
from gnll.cli.main import app as cli
from gnll.policy import AbstentionPolicy
from gnll.serving import ServeSettings, build_proxy_app
from gnll.serving.protocol.tools import ToolRequest
from gnll.serving.schemas import ChatCompletionRequest
from gnll.serving.server import ServerThread
from gnll.serving.tools import render_messages
from gnll.toolwatch import CallWatch

pytestmark = [pytest.mark.vllm, pytest.mark.model]

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
            "additionalProperties": False,
        },
        "strict": True,  # vLLM then decodes the arguments under their schema too
    },
}
#: The same tool without ``strict``: vLLM decodes its calls in ``auto`` without a grammar.
LOOSE = {
    "type": "function",
    "function": {k: v for k, v in WEATHER["function"].items() if k != "strict"},
}
CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}},
    },
}
TOOLS = [WEATHER, CALCULATOR]
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


def _called(k: int, city: str) -> dict:
    args = json.dumps({"city": city})
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": f"c{k}",
                "type": "function",
                "function": {"name": "get_weather", "arguments": args},
            }
        ],
    }


#: Earlier turns of an agent loop in which the model called the tool: SmolLM2-135M then calls it
#: on its own (``tool_choice: "auto"``), which it does not from the tool prompt alone.
SHOTS = [
    {"role": "user", "content": "What is the weather in Rome?"},
    _called(1, "Rome"),
    {"role": "user", "content": "What is the weather in Berlin?"},
    _called(2, "Berlin"),
    {"role": "user", "content": "What is the weather in Madrid?"},
    _called(3, "Madrid"),
    {"role": "user", "content": "What is the weather in Tokyo?"},
]
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string"}, "country": {"type": "string"}},
    "required": ["city", "country"],
    "additionalProperties": False,
}


def _client(url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="x", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def scored(tmp_path_factory):
    """``gnll score`` (in-process hf, teacher forcing) of rows, with tokens and JSON spans."""
    runner = CliRunner()

    def score(rows: list[dict]) -> list[dict]:
        d = tmp_path_factory.mktemp("score")
        src, out = d / "in.jsonl", d / "out.jsonl"
        src.write_text("".join(json.dumps(r) + "\n" for r in rows))
        args = ["score", "-i", str(src), "-o", str(out), "--logprobs", "--spans", "json"]
        result = runner.invoke(cli, [*args, "--verbatim"])
        assert result.exit_code == 0, result.output
        return [json.loads(line) for line in out.read_text().splitlines()]

    return score


def _close(got: float, want: float, tokens: int) -> None:
    # The documented tolerance across paths is per token's log-prob; a sum of n tokens' moves n x.
    assert abs(got - want) <= max(1, tokens) * BATCH_INVARIANCE_ATOL, (got, want, tokens)


def _check_partition(rec: dict) -> None:
    parts = rec["name_tokens"] + rec["structure_tokens"]
    parts += [k for a in rec["arguments"] for k in a["token_indices"]]
    assert sorted(parts) == rec["token_indices"]  # every token of the call in exactly one part
    total = rec["name_nll"] + rec["structure_nll"] + sum(a["nll"] for a in rec["arguments"])
    assert total == pytest.approx(rec["g_nll"], abs=1e-9)  # same path: sums of the same log-probs


def _check_constrained(rec: dict, reported: list[float], raw: np.ndarray) -> None:
    """``rec``'s NLLs are sums of vLLM's reported log-probs over the tokens it names, and those
    are the constrained distribution's: at every token at least the raw (teacher-forced, no
    grammar) log-prob, since renormalising over the allowed tokens only raises it; and above it
    where the grammar forced a token (it reports log-prob 0 there)."""
    lps = np.asarray(reported[: len(raw)])

    def nll(ks: list[int]) -> float:
        return -float(np.sum(lps[ks])) if ks else 0.0

    assert rec["g_nll"] == pytest.approx(
        nll(rec["token_indices"]), abs=1e-9
    )  # same path: sums of the log-probs vLLM reported
    assert rec["name_nll"] == pytest.approx(
        nll(rec["name_tokens"]), abs=1e-9
    )  # same path: sums of the log-probs vLLM reported
    for a in rec["arguments"]:
        assert a["nll"] == pytest.approx(
            nll(a["token_indices"]), abs=1e-9
        )  # same path: sums of the log-probs vLLM reported
    ks = rec["token_indices"]
    assert np.all(lps[ks] >= raw[ks] - BATCH_INVARIANCE_ATOL)
    assert np.any(lps[ks] > raw[ks] + 1.0)  # not the raw distribution


def _check_against_score(rec: dict, row: dict) -> None:
    [want] = row["tool_calls"]
    assert rec["token_indices"] == want["token_indices"]  # the same tokenisation of the output
    assert rec["name_tokens"] == want["name_tokens"]
    _close(rec["g_nll"], want["g_nll"], rec["num_tokens"])
    _close(rec["name_nll"], want["name_nll"], len(rec["name_tokens"]))
    for got, exp in zip(rec["arguments"], want["arguments"], strict=True):
        assert (got["path"], got["token_indices"]) == (exp["path"], exp["token_indices"])
        _close(got["nll"], exp["nll"], got["num_tokens"])


def test_the_tool_template_renders_gnlls_prompt(vllm_server, smollm):
    """vLLM's prompt with tools is the one in-process gnll renders (docs/tools.md); without
    tools, the model's own."""
    lm = smollm
    for messages, tools in ((ASK, TOOLS), (SHOTS, TOOLS), (ASK, None)):
        body = {"model": vllm_server.model, "messages": messages, "add_generation_prompt": True}
        if tools:
            body["tools"] = tools
        r = httpx.post(vllm_server.url + "/tokenize", json=body, timeout=60)
        assert r.status_code == 200, r.text
        req = ChatCompletionRequest.model_validate({"messages": messages, "tools": tools or []})
        turns = render_messages(req, ToolRequest.of(req.model_extra or {}))
        assert r.json()["tokens"] == lm.encode([lm.render_chat(turns)], raw_prompt=True)[0]


NAMED = {"type": "function", "function": {"name": "get_weather"}}


@pytest.mark.parametrize(
    ("tools", "choice", "stream"), [([WEATHER], "required", False), (TOOLS, NAMED, True)]
)
def test_a_required_call_scores_as_its_tokens_teacher_forced(
    vllm_proxy, vllm_server, smollm, tools, choice, stream
):
    """``tool_choice`` required or a named function: vLLM decodes the call under its grammar
    (the hermes format), and its log-probs are then the constrained distribution's (measured
    on vLLM 0.32; the record says so)."""
    kwargs = {"tool_choice": choice, "temperature": 0, "max_tokens": 60, "logprobs": True}
    kwargs["extra_body"] = {"return_token_ids": True}  # vLLM's: passed through by the proxy
    c = _client(vllm_proxy.url).chat.completions
    if stream:
        chunks = list(
            c.create(model=vllm_server.model, messages=ASK, tools=tools, stream=True, **kwargs)
        )
        ids = [
            i
            for ch in chunks
            if ch.choices
            for i in ch.choices[0].model_extra.get("token_ids") or []
        ]
        reported = [
            e.logprob
            for ch in chunks
            if ch.choices and ch.choices[0].logprobs
            for e in ch.choices[0].logprobs.content or []
        ]
        pieces = [t for ch in chunks if ch.choices for t in ch.choices[0].delta.tool_calls or []]
        name = "".join(t.function.name or "" for t in pieces if t.function)
        arguments = "".join(t.function.arguments or "" for t in pieces if t.function)
        last = chunks[-1].choices[0]
        finish, record = last.finish_reason, last.uncertainty
    else:
        r = c.create(model=vllm_server.model, messages=ASK, tools=tools, **kwargs)
        [call] = r.choices[0].message.tool_calls
        name, arguments = call.function.name, call.function.arguments
        finish, record = r.choices[0].finish_reason, r.choices[0].uncertainty
        ids = r.choices[0].model_extra["token_ids"]
        reported = [e.logprob for e in r.choices[0].logprobs.content]
        assert record["tool_calls"][0]["id"] == call.id
    assert (name, json.loads(arguments)) == ("get_weather", {"city": "Paris"})
    assert finish == ("tool_calls" if choice == "required" else "stop")  # as OpenAI's
    [rec] = record["tool_calls"]
    _check_partition(rec)
    assert [a["text"] for a in rec["arguments"]] == ["Paris"]
    assert record["structured"] == {"type": "tool_calls", "logprobs": "constrained"}
    # Under the grammar vLLM may take a token path the tokeniser would not ("g" + "et" for
    # "get"), so a score of the call's *text* tokenises it otherwise: score the very tokens.
    req = ChatCompletionRequest.model_validate({"messages": ASK, "tools": tools})
    prompt = ChatPrompt.of(render_messages(req, ToolRequest.of(req.model_extra or {})))
    raw = smollm.score_tokens([prompt], [ids[: len(reported) - 1]])[0]
    _check_constrained(rec, reported, raw)


def test_an_auto_call_in_an_agent_loop_scores_as_gnll_score_does(vllm_proxy, vllm_server, scored):
    """``tool_choice: "auto"``, no ``strict`` tool: no grammar, the model calls on its own after
    earlier calls, and its log-probs are the raw distribution's: ``gnll score`` of the call
    gives the same numbers."""
    c = _client(vllm_proxy.url).chat.completions
    tools = [LOOSE, CALCULATOR]
    kwargs = {"model": vllm_server.model, "messages": SHOTS, "tools": tools, "max_tokens": 40}
    r = c.create(temperature=0, **kwargs)
    [call] = r.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"city": "Tokyo"}
    [rec] = r.choices[0].uncertainty["tool_calls"]
    assert r.choices[0].uncertainty["structured"]["logprobs"] == "raw"
    _check_partition(rec)
    calls = [{"function": {"name": "get_weather", "arguments": call.function.arguments}}]
    [row] = scored([{"messages": SHOTS, "tools": tools, "answer": {"tool_calls": calls}}])
    _check_against_score(rec, row)
    # The same answer streamed: the deltas go out as vLLM sends them, the record comes last.
    chunks = list(c.create(temperature=0, stream=True, **kwargs))
    [srec] = chunks[-1].choices[0].uncertainty["tool_calls"]
    assert srec["token_indices"] == rec["token_indices"]
    _close(srec["g_nll"], rec["g_nll"], rec["num_tokens"])


@pytest.mark.parametrize("stream", [False, True])
def test_a_withheld_call_leaks_no_byte(vllm_server, stream):
    """Under refuse, a call whose G-NLL is above the threshold never reaches the client."""
    settings = ServeSettings(
        policy=AbstentionPolicy(mode="refuse", threshold=0.01), upstream_timeout=300
    )
    body = {
        "model": vllm_server.model,
        "messages": ASK,
        "tools": [WEATHER],
        "tool_choice": "required",
        "max_tokens": 60,
        "stream": stream,
    }
    with ServerThread(build_proxy_app(vllm_server.base_url, settings)) as px:
        r = httpx.post(px.url + "/v1/chat/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    assert "Paris" not in r.text  # the argument value, anywhere in the response
    rec, _ = check_withheld_call(r, stream)
    assert rec["g_nll"] > 0.01


def test_json_schema_fields_say_which_distribution(vllm_proxy, vllm_server, smollm):
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": CITY_SCHEMA}}
    messages = [{"role": "user", "content": "Name a city and its country, as JSON."}]
    r = _client(vllm_proxy.url).chat.completions.create(
        model=vllm_server.model, messages=messages, response_format=fmt, temperature=0,
        max_tokens=60, logprobs=True, extra_body={"return_token_ids": True},
    )  # fmt: skip
    choice = r.choices[0]
    assert set(json.loads(choice.message.content)) == {"city", "country"}
    u = choice.uncertainty
    structured = u["structured"]
    assert structured["type"] == "json_schema" and structured["logprobs"] == "constrained"
    assert [f["path"] for f in structured["fields"]] == ["$.city", "$.country"]
    reported = np.asarray([e.logprob for e in choice.logprobs.content])
    ids = choice.model_extra["token_ids"][: len(reported) - 1]
    raw = smollm.score_tokens([ChatPrompt.of(messages)], [ids])[0]
    spans = {s["path"]: s for s in u["spans"]}
    for field in structured["fields"]:
        assert field["nll"] == spans[field["path"]]["nll"] > 0
    # renormalised over what the schema allows: never below the raw log-prob of a token, above
    # it where the schema forced one
    assert np.all(reported[: len(raw)] >= raw - BATCH_INVARIANCE_ATOL)
    assert np.any(reported[: len(raw)] > raw + 1.0)


def test_what_vllm_refuses_comes_back_named(vllm_proxy, vllm_server):
    bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "wat"}}}
    with pytest.raises(openai.BadRequestError) as err:
        _client(vllm_proxy.url).chat.completions.create(
            model=vllm_server.model, messages=ASK, response_format=bad, max_tokens=5
        )
    message = err.value.body["message"]
    assert message.startswith("the upstream vllm server refused response_format json_schema:")
    assert "Invalid type: wat" in message  # vLLM's own words


def test_a_vllm_without_auto_tool_choice_is_named(vllm_processed_server):
    """The second server of the run is started without ``--enable-auto-tool-choice``."""
    app = build_proxy_app(vllm_processed_server.base_url, ServeSettings())
    with ServerThread(app) as px, pytest.raises(openai.BadRequestError) as err:
        _client(px.url).chat.completions.create(
            model=vllm_processed_server.model, messages=ASK, tools=TOOLS, max_tokens=5
        )
    message = err.value.body["message"]
    assert message.startswith("the upstream vllm server refused tools (tool_choice auto):")
    assert "--enable-auto-tool-choice" in message


def test_a_call_is_withheld_at_its_crossing_token_as_at_the_end(vllm_server):
    """Early decisions through the proxy (``early=True``, ``refuse``): the proxy streams vLLM's
    answer and closes it at the token where the call's running G-NLL crosses the threshold (vLLM
    aborts the request); the token is the one the end-of-output watch finds in the whole output,
    and the call is withheld either way. A call that does not cross gets the same record whether
    the stream was read to its end or the answer was asked whole."""
    kwargs = {"model": vllm_server.model, "messages": SHOTS, "tools": [LOOSE, CALCULATOR]}
    kwargs.update(max_tokens=40, temperature=0)
    direct = httpx.post(
        vllm_server.base_url + "/chat/completions", json={**kwargs, "logprobs": True}, timeout=300
    ).json()["choices"][0]
    assert direct["message"]["tool_calls"][0]["function"]["name"] == "get_weather"
    entries = direct["logprobs"]["content"][:-1]  # vLLM's end-of-sequence token last
    tokens, lps = [e["token"] for e in entries], [e["logprob"] for e in entries]

    def proxied(early: bool, threshold: float, stream: bool = False, **extra) -> httpx.Response:
        policy = AbstentionPolicy(mode="refuse", threshold=threshold)
        settings = ServeSettings(policy=policy, early=early, upstream_timeout=300)
        with ServerThread(build_proxy_app(vllm_server.base_url, settings)) as px:
            body = {**kwargs, "stream": stream, **extra}
            r = httpx.post(px.url + "/v1/chat/completions", json=body, timeout=300)
        assert r.status_code == 200, r.text
        return r

    # A call that does not cross: the same record early or not (vLLM's ids apart).
    kept = [proxied(early, 1e6).json()["choices"][0] for early in (True, False)]
    for c in kept:
        for rec in c["uncertainty"]["tool_calls"]:
            rec.pop("id")
    assert kept[0]["uncertainty"] == kept[1]["uncertainty"]
    assert [t["function"] for t in kept[0]["message"]["tool_calls"]] == [
        t["function"] for t in kept[1]["message"]["tool_calls"]
    ]
    call = kept[1]["uncertainty"]["tool_calls"][0]["token_indices"]  # the call's tokens
    # The threshold halfway through the call's least likely token (not its first or last): far
    # from every running sum, so that both requests' log-probs cross at the same token.
    j = max(range(1, len(call) - 1), key=lambda i: -lps[call[i]])
    before = 0.0 - sum(lps[k] for k in call[:j])
    threshold = before - lps[call[j]] / 2
    assert -lps[call[j]] / 2 > len(call) * BATCH_INVARIANCE_ATOL
    end = CallWatch(lambda g: g > threshold).read(tokens, lps)
    assert end.decided_at == call[j] + 1 < call[-1] + 1  # before the call's last token

    for stream in (False, True):
        # vLLM writes the 31-token answer in about a second: a proxy slowed by a busy host could
        # read the deciding token after vLLM has finished, leaving nothing to abort. Past its end
        # of sequence (vLLM's ``ignore_eos``) the answer runs on for 200 tokens; its first tokens,
        # and so the decision, are the same.
        r = proxied(True, threshold, stream, ignore_eos=True, max_tokens=200)
        assert "Tokyo" not in r.text
        if stream:
            events = [json.loads(x[6:]) for x in r.text.splitlines() if x.startswith("data: {")]
            assert not any(c["delta"].get("tool_calls") for e in events for c in e["choices"])
            rid = events[0]["id"]
            u = [c for e in events for c in e["choices"] if c.get("finish_reason")][-1]
            u = u["uncertainty"]
        else:
            rid, u = r.json()["id"], r.json()["choices"][0]["uncertainty"]
        # vLLM stopped generating it when the proxy left (its log names the request)
        deadline = time.monotonic() + 30
        while f"Request {rid} aborted" not in vllm_server.log() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert f"Request {rid} aborted" in vllm_server.log()
        assert u["refused"] is True and u["early"] is True
        assert u["decided_at_token"] == end.decided_at
        [rec] = u["tool_calls"]
        assert rec["withheld"] is True and rec["early"] is True and rec["g_nll"] > threshold
        assert rec["token_indices"] == call[: j + 1]
    # Decided at the end of the output (early decisions off): withheld too, the whole call's record.
    r = proxied(False, threshold)
    assert "Tokyo" not in r.text
    u = r.json()["choices"][0]["uncertainty"]
    assert u["refused"] is True and "early" not in u
    assert u["tool_calls"][0]["token_indices"] == call and u["tool_calls"][0]["withheld"] is True
