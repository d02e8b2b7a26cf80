"""`/v1/decisions` through `gnll serve --upstream` in front of a real vLLM (the run's shared
``vllm_server``: its CPU build on the embedded SmolLM2): vLLM teacher-forces every option (``echo``
prompt log-probs), and each option's NLL is what `gnll score` gives that option on the same server,
and what the in-process model gives it, at the documented tolerance."""

from __future__ import annotations

import numpy as np
import openai
import pytest
from decision_helpers import INPUT, QUESTIONS

from gnll import decide, load_model, score
from gnll.backends.base import BATCH_INVARIANCE_ATOL
from gnll.scoring.decisions import parse_questions, question_messages
from gnll.serving import ServeSettings, build_proxy_app
from gnll.serving.server import ServerThread

pytestmark = [pytest.mark.vllm, pytest.mark.model]


def _nlls(answer) -> list[float]:
    return [o["nll"] for o in answer.model_dump()["probabilities"]]


def test_decisions_through_a_real_vllm_equal_gnll_score(vllm_server, smollm):
    settings = ServeSettings(api_key=None, upstream_timeout=300)
    with ServerThread(build_proxy_app(vllm_server.base_url, settings)) as proxy:
        client = openai.OpenAI(base_url=proxy.url + "/v1", api_key="x", max_retries=0, timeout=300)
        d = client.decisions.create(model=vllm_server.model, input=INPUT, questions=QUESTIONS)
    assert [a.type for a in d.answers] == ["predicate", "choice", "score"]
    upstream = load_model(
        vllm_server.model, backend="openai", base_url=vllm_server.base_url, chat=True
    )
    local = decide(smollm, INPUT, QUESTIONS)
    for q, a, ref in zip(parse_questions(QUESTIONS), d.answers, local.answers, strict=True):
        probs = [o["probability"] for o in a.model_dump()["probabilities"]]
        assert abs(sum(probs) - 1) <= 1e-9  # same path: float64 renormalisation
        msgs = question_messages(INPUT, q)
        scored = score(upstream, [msgs] * len(q.options), [o.text for o in q.options])
        assert np.allclose(_nlls(a), [s.nll for s in scored], atol=BATCH_INVARIANCE_ATOL)
        assert np.allclose(_nlls(a), [o.nll for o in ref.options], atol=BATCH_INVARIANCE_ATOL)
