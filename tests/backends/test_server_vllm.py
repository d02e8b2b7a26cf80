"""The openai backend and ``gnll doctor`` against a real vLLM server (its CPU build) on the
embedded SmolLM2 in float32: the run's shared ``vllm_server`` (tests/vllm_helpers.py)."""

from __future__ import annotations

import math

import pytest

from gnll import GenerationConfig, load_model
from gnll.backends.base import BATCH_INVARIANCE_ATOL
from gnll.evaluation.data.tasks import get_task

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def served(vllm_server):
    return load_model(
        vllm_server.model, backend="openai", base_url=vllm_server.base_url, concurrency=2
    )


def test_the_server_is_recognised_as_vllm_with_its_capabilities(served, vllm_server):
    info = served.info()
    assert info["server"] == "vllm"
    caps = served.capabilities
    assert caps.scoring and caps.terminator and caps.chat and not caps.beams
    # the wheel that the tier installs, not some other vLLM
    import httpx

    version = httpx.get(vllm_server.url + "/version", timeout=10).json()["version"]
    from gnll.backends.openai.launch import VLLM_VERSION

    assert version == VLLM_VERSION


def test_greedy_answers_are_finite_and_their_nll_is_the_sum(served):
    td = get_task("triviaqa_short").load(seed=0)
    prompts = [td.prompt(ex) for ex in td.split("eval", 4)]
    cfg = GenerationConfig.greedy(max_new_tokens=24)
    for [g] in served.generate(prompts, cfg):
        assert len(g.token_ids) == len(g.tokens) == len(g.token_logprobs) > 0
        assert all(math.isfinite(v) and v <= 0 for v in g.token_logprobs)
        assert g.finish_reason in ("stop", "eos", "length")
    again = served.generate(prompts[:1], cfg)[0][0]
    first = served.generate(prompts[:1], cfg)[0][0]
    assert again.tokens == first.tokens
    pairs = zip(again.token_logprobs, first.token_logprobs, strict=True)
    assert max(abs(a - b) for a, b in pairs) <= BATCH_INVARIANCE_ATOL


def test_gnll_doctor_passes_every_check(served):
    from gnll.backends.openai.doctor import diagnose

    checks = {c.name: c for c in diagnose(served, requests=4, concurrency=2)}
    verdicts = {name: c.verdict for name, c in checks.items()}
    assert {v for v in verdicts.values()} <= {"pass", "info"}, verdicts
    for name in (
        "reachable", "log-probs returned", "greedy decoding", "server defaults", "log-probs raw",
        "teacher-forced match", "terminator reported", "chat template", "deterministic",
        "concurrent streams",
    ):  # fmt: skip
        assert verdicts[name] == "pass", checks[name]
    assert "vllm server" in checks["reachable"].detail


def test_gnll_doctor_names_a_server_started_with_processed_logprobs(vllm_processed_server):
    """``--logprobs-mode processed_logprobs`` (what TRL and open-instruct tell users to run): the
    raw check fails, recognises the tempered log-probs (at temperature 2 the gaps between
    alternatives halve) and names the flag and its fix; everything else about the server passes."""
    from typer.testing import CliRunner

    from gnll.backends.openai.doctor import diagnose
    from gnll.cli.main import app

    model = load_model(
        vllm_processed_server.model, backend="openai", base_url=vllm_processed_server.base_url
    )
    checks = {c.name: c for c in diagnose(model, requests=2, concurrency=2)}
    raw = checks["log-probs raw"]
    assert raw.verdict == "fail", raw
    assert "shrink to 0.50 of the greedy ones" in raw.detail, raw.detail
    assert "--logprobs-mode processed_logprobs" in raw.detail
    assert "restart vLLM without --logprobs-mode processed_logprobs" in raw.fix
    assert "--logprobs-mode raw_logprobs" in raw.fix
    failed = [name for name, c in checks.items() if c.verdict == "fail"]
    assert failed == ["log-probs raw"], checks
    # the command says so too, and exits 1
    result = CliRunner().invoke(
        app,
        ["doctor", "--base_url", vllm_processed_server.base_url, "--requests", "2"],
        env={"COLUMNS": "400"},
    )
    assert result.exit_code == 1, result.output
    assert "processed_logprobs" in result.output


@pytest.mark.model
def test_gnll_score_through_vllm_equals_the_hf_backend(vllm_server, tmp_path):
    """``gnll score`` (teacher-forced NLL of given answers: vLLM's /tokenize + echo on token ids)
    through the real server and in-process: the same NLL within the documented tolerance per
    token, the same greedy verdicts."""
    import json

    from typer.testing import CliRunner

    from gnll.cli.main import app

    rows = [
        {"question": "What is the capital of France?", "answer": "Paris"},
        {"question": "What is the capital of France?", "answer": "The capital of France is Paris."},
        {"question": "What is the capital of France?", "answer": "Lyon, I think."},
        {"question": "Who wrote Hamlet?", "answer": "William Shakespeare"},
        {"question": "How many legs does a spider have?", "answer": "Eight."},
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = {}
    for name, extra in (
        ("vllm", ["--model_args", f"backend=openai,base_url={vllm_server.base_url}"]),
        ("hf", []),
    ):
        dst = tmp_path / f"{name}.jsonl"
        result = CliRunner().invoke(app, ["score", "-i", str(src), "-o", str(dst), *extra])
        assert result.exit_code == 0, result.output
        out[name] = [json.loads(line) for line in dst.read_text().split("\n") if line]
    for v, h in zip(out["vllm"], out["hf"], strict=True):
        assert not v.get("error") and not h.get("error"), (v, h)
        assert v["num_tokens"] == h["num_tokens"] > 0
        assert v["nll"] == pytest.approx(h["nll"], abs=h["num_tokens"] * BATCH_INVARIANCE_ATOL)
        assert v["is_greedy"] == h["is_greedy"]
    assert {r["is_greedy"] for r in out["hf"]} == {True, False}  # both kinds of answer
