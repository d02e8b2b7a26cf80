"""`gnll serve` on the real embedded model: same answers and G-NLL as the library, under batching,
and the command itself (subprocess, SIGTERM with a request in flight)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import openai
import pytest

from gnll import GenerationConfig
from gnll.backends.base import BATCH_INVARIANCE_ATOL
from gnll.measures import g_nll
from gnll.serving import ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread, free_port

pytestmark = pytest.mark.model

QUESTIONS = [
    "What is the capital of France?",
    "Who wrote Romeo and Juliet?",
    "What is the largest planet in the solar system?",
    "How many legs does a spider have?",
    "What is the chemical symbol for gold?",
    "Which ocean is the largest?",
]
STOP = ["\n", "Question:", "Context:"]


def prompt(q):
    return f"Answer the following question as briefly as possible.\nQuestion: {q}\nAnswer:"


@pytest.fixture(scope="module")
def served(smollm):
    with ServerThread(build_inprocess_app(smollm, ServeSettings())) as srv:
        srv.client = openai.OpenAI(
            base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120
        )
        yield srv


def ask(srv, q, **kw):
    return srv.client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=[{"role": "user", "content": prompt(q)}],
        temperature=0,
        max_tokens=50,
        stop=STOP,
        **kw,
    ).choices[0]


def test_chat_answer_and_g_nll_equal_the_library(served, smollm):
    cfg = GenerationConfig.greedy(max_new_tokens=50, stop=tuple(STOP))
    [[gen]] = smollm.generate([prompt(QUESTIONS[0])], cfg)
    choice = ask(served, QUESTIONS[0], logprobs=True)
    assert choice.message.content.strip() == gen.text and "Paris" in gen.text
    assert choice.uncertainty["g_nll"] == pytest.approx(g_nll(gen.token_logprobs), abs=BATCH_INVARIANCE_ATOL)
    assert choice.uncertainty["tokens"] == gen.tokens


def test_concurrent_requests_are_batched_and_give_the_same_answers(served):
    alone = {q: ask(served, q) for q in QUESTIONS}
    batches_before = served_engine_batches(served)
    together: dict[str, object] = {}
    threads = [
        threading.Thread(target=lambda q=q: together.__setitem__(q, ask(served, q)))
        for q in QUESTIONS
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert served_engine_batches(served) - batches_before < len(QUESTIONS)  # shared generate calls
    for q in QUESTIONS:
        assert together[q].message.content == alone[q].message.content
        # Padding in a batch moves float32 logits in the last digits only.
        assert together[q].uncertainty["g_nll"] == pytest.approx(
            alone[q].uncertainty["g_nll"], abs=2e-3
        )


def test_a_request_joins_a_running_decoding_loop(served):
    """Continuous batching: a short request sent while a long one decodes joins that loop at its
    next step and is answered first, in the same batched run."""
    runs_before = served_engine_batches(served)
    done: dict[str, float] = {}

    def long() -> None:
        # It counts on for all 200 tokens (several seconds); the old prompt's answer ended with EOS
        # after 28 tokens, about a second, so on a busy host it could end before `short` arrived.
        served.client.completions.create(
            model="smollm2-135m-instruct",
            prompt="1, 2, 3, 4, 5, 6, 7, 8, 9, 10,",
            max_tokens=200,
            temperature=0,
        )
        done["long"] = time.perf_counter()

    t = threading.Thread(target=long)
    t.start()
    time.sleep(1.0)  # the long request is decoding now
    short = ask(served, QUESTIONS[4])
    done["short"] = time.perf_counter()
    t.join(300)
    assert short.message.content and done["short"] < done["long"]
    assert served_engine_batches(served) - runs_before == 1


def test_unseeded_samples_of_one_prompt_are_independent_between_requests(served):
    def sample(seed=None):
        return [
            c.text
            for c in served.client.completions.create(
                model="smollm2-135m-instruct",
                prompt="Here is a list of random unusual words:",
                max_tokens=8,
                temperature=1.5,
                n=2,
                seed=seed,
            ).choices
        ]

    outs: list[list[str]] = []
    threads = [threading.Thread(target=lambda: outs.append(sample())) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert len(outs) == 2 and outs[0] != outs[1]
    assert sample(seed=7) == sample(seed=7)


def served_engine_batches(srv) -> int:
    text = httpx.get(srv.url + "/metrics").text
    line = next(ln for ln in text.splitlines() if ln.startswith("gnll_batch_prompts_count"))
    return int(float(line.split()[-1]))


def test_raw_completion_and_system_message(served, smollm):
    r = served.client.completions.create(
        model="smollm2-135m-instruct", prompt="The capital of France is", max_tokens=3, logprobs=1
    ).choices[0]
    assert r.text.startswith(" Paris") and r.uncertainty["num_tokens"] == 3
    [[gen]] = smollm.generate(
        ["The capital of France is"],
        GenerationConfig.greedy(max_new_tokens=3, stop=()),
        raw_prompt=True,
    )
    assert r.uncertainty["g_nll"] == pytest.approx(g_nll(gen.token_logprobs), abs=BATCH_INVARIANCE_ATOL)
    sys_chat = served.client.chat.completions.create(
        model="smollm2-135m-instruct",
        messages=[
            {"role": "system", "content": "Answer with one word."},
            {"role": "user", "content": "What is the capital of France?"},
        ],
        max_tokens=10,
    ).choices[0]
    assert "Paris" in sys_chat.message.content and sys_chat.uncertainty["g_nll"] > 0


@pytest.mark.server
def test_gnll_serve_command_shuts_down_gracefully(tmp_path):
    """`gnll serve` as users start it; SIGTERM while a request decodes: it is answered, then exit 0."""
    port = free_port()
    env = {**os.environ, "GNLL_API_KEY": "k-123-secret", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "from gnll.cli.main import app; app()",
            "serve",
            "--port",
            str(port),
            "--threshold",
            "3",
            "--policy",
            "flag",
        ],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while True:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, "server did not start"
            time.sleep(0.5)
        result = {}

        def long_request():
            result["r"] = httpx.post(
                url + "/v1/completions",
                json={"prompt": "Once upon a time", "max_tokens": 120},
                headers={"Authorization": "Bearer k-123-secret"},
                timeout=120,
            )

        t = threading.Thread(target=long_request)
        t.start()
        time.sleep(1.0)  # the request is decoding
        proc.send_signal(signal.SIGTERM)
        t.join(120)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert result["r"].status_code == 200
    assert result["r"].json()["choices"][0]["uncertainty"]["num_tokens"] > 0
    # uvicorn finishes the shutdown, then re-raises the captured SIGTERM (exit status -15).
    assert proc.returncode in (0, -signal.SIGTERM)
    assert "Finished server process" in err
    assert "k-123-secret" not in out + err  # the key never reaches the logs
    access = [json.loads(ln) for ln in err.splitlines() if ln.startswith('{"event": "request"')]
    assert any(a["path"] == "/v1/completions" and a["status"] == 200 for a in access)
    assert not any("Once upon a time" in json.dumps(a) for a in access)
