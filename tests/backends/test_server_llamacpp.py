"""The server backend against a real llama.cpp server (llama-cpp-python) on the embedded SmolLM2 GGUF.

scripts/test.sh builds ``llama-cpp-python[server]`` from source; the server runs on 127.0.0.1 and a
free port for the session and is killed at the end (and by a hard ``timeout`` if pytest dies).
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np
import pytest
from scipy.stats import spearmanr
from standin import StandIn
from typer.testing import CliRunner

from gnll import GenerationConfig, load_model
from gnll.backends.openai.launch import LlamaServer
from gnll.cli.main import app
from gnll.evaluation.data.tasks import get_task

pytestmark = pytest.mark.server

MODEL = "smollm2-135m-instruct"
SRC = Path(__file__).resolve().parents[2] / "src"
#: Measured by ``python scripts/server_agreement.py --prompts 50 --max-new-tokens 32`` (docs/servers.md):
#: 35 of 50 greedy answers equal; where equal, |G-NLL(server) - G-NLL(hf)| <= 14.7% of G-NLL (median
#: 0.14 nats) and Spearman 0.999. Both start from the same Q4_1 weights, but the hf backend computes
#: with de-quantised float32 weights and activations while llama.cpp quantises the activations to
#: 8 bits in its matrix products: per-token log-probs differ by up to 0.38, which flips near-ties
#: (most partings are at a server-side margin under 0.13 nats).
MIN_EQUAL_ANSWERS = 33
GNLL_REL_TOLERANCE = 0.2
MIN_SPEARMAN = 0.99
#: A wide terminal for rich, so that table cells are not wrapped in the captured output.
WIDE = {"COLUMNS": "400"}


@pytest.fixture(scope="session")
def served(llama_server):
    return load_model(MODEL, backend="openai", base_url=llama_server.base_url, concurrency=1)


@pytest.fixture(scope="session")
def trivia_prompts() -> list[str]:
    td = get_task("triviaqa_short").load(seed=0)
    return [td.prompt(ex) for ex in td.split("eval", 50)]


def _gnll(g) -> float:
    return -float(np.sum(g.token_logprobs))


def test_capabilities_and_info_are_declared(served):
    caps = served.capabilities
    assert caps.chat and not caps.beams and not caps.scoring and not caps.terminator
    info = served.info()
    assert info["server"] == "llama-cpp-python" and info["endpoint"] == "chat"
    assert info["pinned_parameters"]["repeat_penalty"] == 1.0
    assert info["pinned_parameters"]["top_k"] == 0 and info["pinned_parameters"]["min_p"] == 0.0
    with pytest.raises(NotImplementedError, match="cannot score given answers"):
        served.score(["q"], ["a"])


@pytest.mark.model
def test_greedy_answers_and_gnll_agree_with_the_in_process_backend(smollm, served, trivia_prompts):
    cfg = GenerationConfig.greedy(max_new_tokens=32)
    hf = [g[0] for g in smollm.generate(trivia_prompts, cfg)]
    sv = [g[0] for g in served.generate(trivia_prompts, cfg)]
    for g in sv:  # the backend contract
        assert len(g.token_ids) == len(g.tokens) == len(g.token_logprobs)
        assert all(math.isfinite(v) and v <= 0 for v in g.token_logprobs)
        assert not any(t.startswith("token_id:") for t in g.tokens)
    same = [(a, b) for a, b in zip(hf, sv, strict=True) if a.text == b.text]
    assert len(same) >= MIN_EQUAL_ANSWERS, len(same)
    rel = [abs(_gnll(a) - _gnll(b)) / max(_gnll(a), 1e-6) for a, b in same]
    assert max(rel) <= GNLL_REL_TOLERANCE, sorted(rel)[-5:]
    rho = spearmanr([_gnll(a) for a, _ in same], [_gnll(b) for _, b in same])[0]
    assert rho >= MIN_SPEARMAN, rho


@pytest.mark.model
def test_chat_endpoint_and_completions_endpoint_agree(smollm, llama_server, trivia_prompts):
    url = llama_server.base_url
    chat = load_model(MODEL, backend="openai", base_url=url, endpoint="chat")
    plain = load_model(MODEL, backend="openai", base_url=url, endpoint="completions", chat=False)
    prompts = trivia_prompts[:8]
    cfg = GenerationConfig.greedy(max_new_tokens=32)
    via_chat = [g[0] for g in chat.generate(prompts, cfg)]
    # The same chat-formatted text, sent as a plain completion prompt.
    via_text = [g[0] for g in plain.generate([smollm.render_prompt(p) for p in prompts], cfg)]
    for a, b in zip(via_chat, via_text, strict=True):
        assert a.text == b.text and a.tokens == b.tokens
        assert _gnll(a) == pytest.approx(_gnll(b), abs=1e-4)


def test_terminator_split_on_a_real_server(served, trivia_prompts):
    [[g]] = served.generate(trivia_prompts[:1])
    assert g.finish_reason in ("stop", "eos")
    if g.finish_reason == "stop":  # the newline token is reported and split off
        assert g.terminator_logprobs and g.stop_sequence == "\n"
    with pytest.raises(NotImplementedError, match="end-of-sequence"):
        served.generate(trivia_prompts[:1], GenerationConfig.greedy(include_terminator=True))


def test_eval_through_the_server_writes_the_usual_outputs(llama_server, tmp_path):
    out = tmp_path / "run"
    result = CliRunner().invoke(
        app,
        [
            "eval", "--model", MODEL, "--tasks", "triviaqa_short", "--limit", "20",
            "--model_args", f"backend=openai,base_url={llama_server.base_url}",
            "--measures", "g-nll,ln-g-nll,pe,se", "--samples", "3", "--temperature", "1.0",
            "--output_path", str(out), "--no-plots", "--no-progress",
        ],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    for name in ("results.json", "table.md", "samples.jsonl"):
        assert (out / name).exists(), name
    results = json.loads((out / "results.json").read_text())
    assert "g-nll" in json.dumps(results) and "se" in json.dumps(results)
    # split("\n"), not splitlines(): answers may hold U+2028 and friends inside JSON strings.
    text = (out / "samples.jsonl").read_text(encoding="utf-8")
    rows = [json.loads(line) for line in text.split("\n") if line.strip()]
    assert len(rows) == 20


def test_doctor_passes_on_the_real_server(llama_server):
    result = CliRunner().invoke(
        app, ["doctor", "--base_url", llama_server.base_url, "--requests", "4"], env=WIDE
    )
    assert result.exit_code == 0, result.output
    for check in ("greedy decoding", "log-probs raw", "teacher-forced match", "deterministic"):
        assert check in result.output


def test_doctor_fails_behind_a_gateway_that_drops_sampling_fields(llama_server):
    keep = {"model", "prompt", "messages", "max_tokens", "stop", "logprobs", "top_logprobs", "echo"}

    def gateway(method, path, body):
        url = llama_server.base_url[: -len("/v1")] + path
        if method == "GET":
            r = httpx.get(url, timeout=60)
        else:  # the server's own defaults apply: temperature 0.8, top_k 40, repeat_penalty 1.1
            r = httpx.post(url, json={k: v for k, v in body.items() if k in keep}, timeout=60)
        return r.status_code, r.content

    with StandIn(gateway) as proxy:
        result = CliRunner().invoke(
            app, ["doctor", "--base_url", proxy.url, "--requests", "2"], env=WIDE
        )
    assert result.exit_code == 1, result.output
    assert "would be wrong: greedy decoding" in result.output
    assert "ignores the request's sampling fields" in result.output


def _eval_cmd(url: str, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-c", "from gnll.cli.main import app; app()",
        "eval", "--model", MODEL, "--tasks", "triviaqa_short", "--limit", "8",
        "--model_args", f"backend=openai,base_url={url},max_retries=1,backoff=0.1",
        "--measures", "g-nll,pe", "--samples", "3", "--temperature", "1.0", "--chunk_size", "4",
        "--output_path", str(out), "--no-plots", "--no-progress", *extra,
    ]  # fmt: skip


@pytest.mark.e2e
def test_killed_server_stops_eval_and_resume_finishes_identically(gguf, tmp_path):
    env = {**os.environ, "PYTHONPATH": f"{SRC}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    server = LlamaServer(gguf, MODEL, lifetime=1200)
    try:
        server.start()
        full = tmp_path / "full"
        subprocess.run(_eval_cmd(server.base_url, full), env=env, check=True, capture_output=True)

        cut = tmp_path / "cut"
        proc = subprocess.Popen(
            _eval_cmd(server.base_url, cut),
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            done = sum(p.read_text().count('"gen"') for p in cut.rglob("greedy*.jsonl"))
            if done >= 2:
                break
            time.sleep(0.2)
        server.stop(signal.SIGKILL)
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode != 0
        message = " ".join(stderr.split())
        assert "Traceback" not in stderr and server.base_url in message, stderr[-2000:]
        assert "failed after 2 attempts" in message

        server.start()
        subprocess.run(
            _eval_cmd(server.base_url, cut, "--resume"), env=env, check=True, capture_output=True
        )
        a = json.loads((full / "results.json").read_text())["tasks"]
        b = json.loads((cut / "results.json").read_text())["tasks"]
        assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
    finally:
        server.stop()
