"""The server backend against stand-ins replaying vLLM's and llama.cpp's documented response shapes.

These cover the parsing paths no server here can produce (vLLM needs a GPU build; the C++ llama-server
is not built here); ``tests/backends/test_server_llamacpp.py`` runs the same backend against a real server.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from standin import StandIn

from gnll import GenerationConfig, load_model
from gnll.backends.base import GenerationErrors
from gnll.backends.openai import ServerUnavailable

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def fx(name: str) -> dict:
    return json.loads((FIXTURES / f"{name}.json").read_text())


def vllm(completion: str = "vllm/completion_stop_newline", **extra):
    """A vLLM stand-in answering every completion with one recorded response."""

    def respond(method, path, body):
        if path == "/v1/models":
            return 200, fx("vllm/models")
        if path == "/tokenize":
            full = body.get("continue_final_message") or body.get("prompt", "").endswith(" Paris")
            return 200, fx("vllm/tokenize_full" if full else "vllm/tokenize_prefix")
        if path == "/detokenize":
            return 200, {"prompt": "<|im_start|>user\nCapital of France?<|im_end|>\n"}
        if path in extra:
            return extra[path](body)
        if body.get("echo"):
            return 200, fx("vllm/echo_score")
        return 200, fx(completion)

    return StandIn(respond)


def model_for(srv: StandIn, name: str = "served-model", **kw):
    return load_model(name, backend="openai", base_url=srv.url, timeout=5, backoff=0.01, **kw)


@pytest.mark.parametrize(
    ("fixture", "tokens", "lps", "term", "finish"),
    [
        ("completion_stop_newline", [" Paris"], [-0.25], [-0.5], "stop"),
        ("completion_eos", [" Paris"], [-0.25], [-0.125], "eos"),
        ("completion_merged_stop", [" Paris"], [-0.25], [-1.5], "stop"),
        ("completion_length", [" Paris", " is", " the"], [-0.25, -0.75, -0.5], [], "length"),
    ],
)
def test_vllm_terminator_is_split_off(fixture, tokens, lps, term, finish):
    with vllm(f"vllm/{fixture}") as server:
        model = model_for(server)
        [[g]] = model.generate(["Capital of France?"])
        assert g.tokens == tokens and g.token_logprobs == lps and g.terminator_logprobs == term
        assert g.finish_reason == finish
        assert len(g.token_ids) == len(g.tokens) == len(g.token_logprobs)
        assert all(math.isfinite(v) and v <= 0 for v in g.token_logprobs)
        [[gt]] = model.generate(
            ["Capital of France?"], GenerationConfig.greedy(include_terminator=True)
        )
        assert gt.token_logprobs == lps + term


def test_vllm_requests_pin_sampling_and_use_the_chat_template_via_tokenize():
    with vllm() as server:
        model = model_for(server, name="org/Model-Instruct")
        [[g]] = model.generate(["Capital of France?"])
        assert g.token_ids == [7042]
        _, path, tok_body, _ = server.requests[1]
        assert path == "/tokenize" and tok_body["add_generation_prompt"] is True
        assert tok_body["messages"] == [{"role": "user", "content": "Capital of France?"}]
        _, path, body, _ = server.requests[-1]
        assert path == "/v1/completions"
        assert body["prompt"] == fx("vllm/tokenize_prefix")["tokens"]
        assert body["temperature"] == 0.0 and body["top_k"] == -1 and body["top_p"] == 1.0
        assert body["min_p"] == 0.0 and body["repetition_penalty"] == 1.0
        assert body["return_token_ids"] is True and body["logprobs"] == 1
        assert "return_tokens_as_token_ids" not in body
        info = model.info()
        assert info["server"] == "vllm" and info["pinned_parameters"]["top_k"] == -1
        assert model.render_prompt("Capital of France?").startswith("<|im_start|>user")


def test_sampling_uses_n_and_a_seed_that_does_not_depend_on_batch_position():
    with vllm("vllm/completion_n3") as server:
        model = model_for(server)
        cfg = GenerationConfig.sample(3, temperature=0.5, seed=1)
        [a, b] = model.generate(["q1", "q2"], cfg)
        assert [g.text for g in a] == ["Paris", "Lyon", "Paris"]
        seeds = {r[2]["prompt"]: r[2]["seed"] for r in server.requests if r[1] == "/v1/completions"}
        model.generate(["q2"], cfg)
        assert server.requests[-1][2]["seed"] == seeds["q2"] and seeds["q1"] != seeds["q2"]
        assert server.requests[-1][2]["n"] == 3 and server.requests[-1][2]["temperature"] == 0.5


def test_sentinel_is_an_error_naming_prompt_and_token_and_other_prompts_survive():
    def respond(body):
        name = "sentinel" if body["prompt"] == "bad" else "stop_newline"
        return 200, fx(f"vllm/completion_{name}")

    with vllm(**{"/v1/completions": respond}) as server:
        model = model_for(server)
        with pytest.raises(GenerationErrors) as err:
            model.generate(["good", "bad", "good"])
        assert set(err.value.errors) == {1}
        assert "prompt 1" in err.value.errors[1] and "' Lyon'" in err.value.errors[1]
        assert "-inf" in err.value.errors[1]
        assert err.value.results[1] is None and err.value.results[0][0].text == "Paris"


def test_chat_shape_and_llamacpp_content_shape():
    server_answer = fx("vllm/chat_stop")
    with StandIn(lambda m, p, b: (200, server_answer)) as chat:
        model = model_for(chat, server="openai")
        [[g]] = model.generate(["Capital of France?"])
        assert g.tokens == [" Paris"] and g.token_logprobs == [-0.25] and g.token_ids == [7042]
        assert g.terminator_logprobs == [-0.5] and g.finish_reason == "stop"
        body = chat.requests[-1][2]
        assert chat.requests[-1][1] == "/v1/chat/completions"
        assert body["logprobs"] is True and "max_completion_tokens" in body
        assert "top_k" not in body  # OpenAI rejects unknown sampling fields

    def llamacpp(method, path, body):
        if path == "/v1/models":
            return 200, fx("llamacpp/models")
        return 200, fx("llamacpp/completion_content_shape")

    with StandIn(llamacpp) as server:
        model = model_for(server)
        [[g]] = model.generate(["Capital of France?"])
        assert model.info()["server"] == "llama.cpp"
        assert g.tokens == [" Paris"] and g.token_ids == [7042] and g.token_logprobs == [-0.25]
        body = server.requests[-1][2]
        assert body["top_k"] == 0 and body["min_p"] == 0.0 and body["repeat_penalty"] == 1.0
        assert "return_token_ids" not in body
        with pytest.raises(NotImplementedError, match="score given answers"):
            model.score(["q"], ["a"])
        with pytest.raises(NotImplementedError, match="end-of-sequence"):
            model.generate(["q"], GenerationConfig.greedy(include_terminator=True))


def test_score_through_vllm_echo():
    with vllm() as server:
        model = model_for(server, name="org/Model-Instruct")
        assert model.capabilities.scoring and not model.capabilities.beams
        [s] = model.score(["Capital of France?"], [" Paris"])
        assert s.tokens == [" Paris"] and s.token_ids == [7042] and s.token_logprobs == [-0.3]
        assert s.is_greedy is False and s.greedy_stops is True and not s.boundary_merged
        assert s.nll == pytest.approx(0.3)
        echo = server.requests[-1][2]
        assert echo["echo"] is True and echo["prompt"] == fx("vllm/tokenize_full")["tokens"]
        cont = [r[2] for r in server.requests if r[1] == "/tokenize"][-1]
        assert cont["continue_final_message"] is True and cont["add_generation_prompt"] is False


def test_retries_then_isolates_or_stops(monkeypatch):
    calls = {"n": 0}

    def flaky(method, path, body):
        if path == "/v1/models":
            return 200, fx("vllm/models")
        calls["n"] += 1
        if calls["n"] <= 2:
            return 503, {"error": "warming up"}
        if body["prompt"] == "rejected":
            return 400, {"error": "prompt too long"}
        return 200, fx("vllm/completion_stop_newline")

    with StandIn(flaky) as server:
        model = model_for(server, concurrency=1)
        [[g]] = model.generate(["q"])
        assert g.text == "Paris" and calls["n"] == 3
        with pytest.raises(GenerationErrors, match="HTTP 400") as err:
            model.generate(["q", "rejected"])
        assert err.value.results[0] is not None and list(err.value.errors) == [1]

    with StandIn(lambda m, p, b: (200, b"not json")) as server:
        model = model_for(server, server="vllm")
        with pytest.raises(GenerationErrors, match="invalid JSON"):
            model.generate(["q"])
    dead = load_model(
        "m",
        backend="openai",
        base_url="http://127.0.0.1:9/v1",
        server="vllm",
        timeout=1,
        max_retries=1,
        backoff=0.01,
    )
    with pytest.raises(ServerUnavailable, match="after 2 attempts"):
        dead.generate(["q"])
    with pytest.raises(NotImplementedError, match="beam"):
        dead.generate(["q"], GenerationConfig.beam(2))


def test_api_key_from_environment_never_recorded_nor_sent_on_redirects(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-very-secret")

    def redirect(method, path, body):
        if path == "/v1/models":
            return 200, fx("vllm/models")
        return 307, {"error": "moved sk-very-secret"}

    with StandIn(redirect) as server:
        model = model_for(server)
        with pytest.raises(GenerationErrors) as err:
            model.generate(["q"])
        message = str(err.value)
        assert "redirects" in message and "sk-very-secret" not in message
        assert server.requests[0][3].get("Authorization") == "Bearer sk-very-secret"
        assert len(server.requests) == 2  # the redirect was not followed
        assert "sk-very-secret" not in json.dumps(model.info()) + repr(model) + repr(model.client)
    with pytest.raises(ValueError, match="base_url"):
        load_model("served-model", backend="openai")


def test_eval_refuses_measures_the_server_cannot_compute_before_any_work(tmp_path):
    from typer.testing import CliRunner

    from gnll.cli.main import app

    with vllm() as server:
        args = ["eval", "--model", "served-model", "--tasks", "triviaqa_short", "--limit", "2",
                "--model_args", f"backend=openai,base_url={server.url}",
                "--measures", "g-nll,bs-msp,pe", "--output_path", str(tmp_path / "run")]  # fmt: skip
        result = CliRunner().invoke(app, args)
        assert result.exit_code == 2, result.output
        text = " ".join(result.output.split())
        assert "cannot compute bs-msp (needs beams)" in text and "--measures pe,g-nll" in text
        assert [r[1] for r in server.requests] == ["/v1/models"]  # nothing generated


def test_eval_keeps_the_prompts_that_worked_and_resume_retries_the_failed_one(tmp_path):
    from typer.testing import CliRunner

    from gnll.cli.main import app

    bad: dict[str, str | None] = {"prompt": None}

    def completions(body):
        if bad["prompt"] is None:
            bad["prompt"] = body["prompt"]  # the first question's prompt is rejected
        if body["prompt"] == bad["prompt"] and not bad.get("fixed"):
            return 400, {"error": "prompt rejected"}
        return 200, fx("vllm/completion_stop_newline")

    out = tmp_path / "run"
    with vllm(**{"/v1/completions": completions}) as server:
        args = ["eval", "--model", "served-model", "--tasks", "triviaqa_short", "--limit", "3",
                "--model_args", f"backend=openai,base_url={server.url},concurrency=1",
                "--measures", "g-nll", "--output_path", str(out), "--no-plots",
                "--no-progress"]  # fmt: skip
        first = CliRunner().invoke(app, args)
        assert first.exit_code == 2, first.output
        text = " ".join(first.output.split())
        assert "1 question(s) failed at the greedy stage" in text and "--resume" in text
        [failure] = [
            json.loads(x) for x in next(out.rglob("failures.jsonl")).read_text().splitlines()
        ]
        assert "HTTP 400" in failure["error"] and failure["stage"] == "greedy"
        greedy = [json.loads(x) for x in next(out.rglob("greedy*.jsonl")).read_text().splitlines()]
        assert len([r for r in greedy if "gen" in r]) == 2  # the other two were kept
        bad["fixed"] = "yes"
        n_before = len(server.requests)
        second = CliRunner().invoke(app, [*args, "--resume"])
        assert second.exit_code == 0, second.output
        retried = [r[2]["prompt"] for r in server.requests[n_before:] if r[1] == "/v1/completions"]
        assert bad["prompt"] in retried
        greedy = [json.loads(x) for x in next(out.rglob("greedy*.jsonl")).read_text().splitlines()]
        assert len({tuple(r["k"]) for r in greedy if "gen" in r}) == 3
        assert len([r for r in greedy if "gen" in r]) == 3  # nothing appended twice
