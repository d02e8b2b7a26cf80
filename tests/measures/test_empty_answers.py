"""One rule for empty answers on every surface: the stop token's log-prob, never "G-NLL 0, certain".

An empty answer (the model ended at once) is scored by the log-prob of the token that ended it
(``Generation.measured_logprobs``). Checked here on the library (``Generation``, ``measures``),
the beam ranking (the real ``rescore_beams``), the Fig. 2 ablation, ``gnll score --with-greedy``,
``gnll serve`` in-process (over HTTP with the openai client) and through a server backend, and
``gnll eval``'s refusal of ``--sample_logprobs sampling`` where a backend lacks tempered log-probs.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace

import numpy as np
import openai
import pytest
from fakes import FakeModel, cfg, make_data_dir
from serve_helpers import ScriptedModel

from gnll import measures as M
from gnll.backends.base import (
    Capabilities,
    EmptyAnswerError,
    Generation,
    GenerationConfig,
)

STOP_LP = -2.5  # log-prob of the stop token that ended the empty answer


def empty(terminator=(STOP_LP, -0.1)) -> Generation:
    return Generation(
        "", [], [], [], "stop", "\n", terminator_token_ids=[198] * len(terminator),
        terminator_logprobs=list(terminator),
    )  # fmt: skip


def test_generation_scores_an_empty_answer_by_its_stop_token():
    g = empty()
    assert g.measured_logprobs == [STOP_LP]
    assert g.logprob == STOP_LP
    full = Generation("Paris", [7], ["Paris"], [-0.2], "stop", terminator_logprobs=[-0.05])
    assert full.measured_logprobs == [-0.2] and full.logprob == -0.2
    with pytest.raises(EmptyAnswerError, match="stop token's log-prob"):
        _ = empty(terminator=()).measured_logprobs


def test_measures_apply_the_rule_to_a_generation():
    g = empty()
    assert M.compute(["g-nll", "ln-g-nll"], greedy=g) == {"g-nll": 2.5, "ln-g-nll": 2.5}
    assert M.g_nll(g) == 2.5
    assert M.predictive_entropy([g, Generation("a", [1], ["a"], [-0.5], "eos")]) == 1.5
    assert M.compute(["pe"], samples=[g, g]) == {"pe": 2.5}


class PrefixScorer:
    """Teacher-forced log-probs of the continuations as a lookup (``rescore_beams``'s scorer)."""

    def __init__(self, table):
        self.table = table

    def __call__(self, prompts, conts):
        return [np.asarray(self.table[tuple(c)], dtype=np.float64) for c in conts]


def test_rescore_beams_never_ranks_an_empty_beam_first_for_free():
    from gnll.backends.hf.hf_generate import rescore_beams

    gens = [
        Generation("", [], [], [], "stop", "\n", [198], []),
        Generation("Paris", [5], ["Paris"], [], "stop", "\n", [198], []),
    ]
    scorer = PrefixScorer({(198,): [-1.5], (5, 198): [-0.2, -0.05]})
    out = rescore_beams([[1, 2, 3]], gens, 2, GenerationConfig.beam(2), scorer)
    assert [g.text for g in out] == ["Paris", ""]  # -0.2 beats the empty beam's -1.5
    assert out[1].measured_logprobs == [-1.5]
    # ... and an empty beam whose stop token is the likeliest continuation does rank first
    scorer = PrefixScorer({(198,): [-0.1], (5, 198): [-0.2, -0.05]})
    out = rescore_beams([[1, 2, 3]], gens, 2, GenerationConfig.beam(2), scorer)
    assert [g.text for g in out] == ["", "Paris"]


class EmptyWhenOdd(FakeModel):
    """Every output (greedy, beams, samples) of every other question is empty and unlikely."""

    def generate(self, prompts, config=None, **kw):
        out = super().generate(prompts, config, **kw)
        for i, p in enumerate(prompts):
            if len(p) % 2:
                out[i] = [
                    replace(g, text="", token_ids=[], tokens=[], token_logprobs=[],
                            terminator_logprobs=[-6.0])
                    for g in out[i]
                ]  # fmt: skip
        return out


def test_ablation_scores_empty_answers_beams_and_samples_by_their_stop_token(tmp_path, monkeypatch):
    from gnll.evaluation.data.tasks import get_task
    from gnll.evaluation.figures import ablation

    seen = []
    real = ablation.bootstrap_auroc

    def spy(correct, scores, **kw):
        seen.append(list(scores))
        return real(correct, scores, **kw)

    monkeypatch.setattr(ablation, "bootstrap_auroc", spy)
    td = get_task("triviaqa_short").load(data_dir=make_data_dir(tmp_path / "data"))
    model = EmptyWhenOdd()
    ablation.run_ablation(model, td, limit=20, widths=(1, 2), temperatures=(1.0,), samples=2)
    prompts = [td.prompt(e) for e in td.split("eval", 20)]
    odd = [len(p) % 2 == 1 for p in prompts]
    assert any(odd) and not all(odd)
    for scores in seen:  # greedy, each beam width, each number of samples
        for s, is_empty in zip(scores, odd, strict=True):
            if is_empty:
                assert s == 6.0  # not 0 ("certain")


def test_score_with_greedy_reports_the_rule(tmp_path):
    from fakes import ToyModel

    from gnll.scoring.stream import ScoreJob, run_score_job

    class EmptyGreedy(ToyModel):
        def generate(self, prompts, config=None, **kw):
            return [[empty()] for _ in prompts]

    inp, out = tmp_path / "in.jsonl", tmp_path / "out.jsonl"
    inp.write_text(json.dumps({"question": "Who?", "answer": "abc"}) + "\n")
    job = ScoreJob(str(inp), str(out), "jsonl", "jsonl", None, with_greedy=True,
                   progress=False)  # fmt: skip
    run_score_job(EmptyGreedy(), job)
    [row] = [json.loads(line) for line in out.read_text().splitlines()]
    assert row["greedy_answer"] == "" and row["g_nll"] == 2.5


class EmptyScripted(ScriptedModel):
    """The scripted server model, answering the prompt "empty" with nothing (stop token -2.5)."""

    def generate(self, prompts, config=None, **kwargs):
        out = super().generate(prompts, config, **kwargs)
        return [
            [empty()] * len(gens) if p.strip() == "empty" else gens
            for p, gens in zip(prompts, out, strict=True)
        ]


def test_serve_reports_the_rule_and_the_policy_sees_it():
    from gnll.serving import AbstentionPolicy, ServeSettings, build_inprocess_app
    from gnll.serving.server import ServerThread

    settings = ServeSettings(policy=AbstentionPolicy(mode="refuse", threshold=2.0))
    with ServerThread(build_inprocess_app(EmptyScripted(), settings, max_wait_ms=20)) as srv:
        c = openai.OpenAI(base_url=srv.url + "/v1", api_key="none", max_retries=0, timeout=30)
        r = c.completions.create(model="scripted", prompt="empty", max_tokens=5)
        u = r.choices[0].uncertainty
        assert u["g_nll"] == 2.5 and u["nll"] == 2.5 and u["num_tokens"] == 0
        assert u["abstain"] is True  # G-NLL 2.5 > 2.0: refused, not "certain"
        r = c.completions.create(model="scripted", prompt="sure", max_tokens=5)
        assert r.choices[0].uncertainty["abstain"] is False


def test_server_backend_empty_answer_without_stop_token_log_prob_is_an_error():
    from gnll.backends.openai.client import ServerError
    from gnll.backends.openai.parse import read_choice, to_generation

    eos = read_choice(
        {"text": "", "finish_reason": "stop", "logprobs": {"tokens": [], "token_logprobs": []}}
    )
    with pytest.raises(ServerError, match="empty and the server reported no log-prob"):
        to_generation(eos, GenerationConfig.greedy(), eos_logprob=False, where="prompt 0")
    stop = read_choice(
        {"text": "", "finish_reason": "stop", "stop_reason": "\n",
         "logprobs": {"tokens": ["\n"], "token_logprobs": [-1.25]}}
    )  # fmt: skip
    g = to_generation(stop, GenerationConfig.greedy(), eos_logprob=True, where="prompt 0")
    assert g.measured_logprobs == [-1.25] and M.g_nll(g) == 1.25


def test_eval_refuses_sampling_logprobs_on_a_backend_without_them(tmp_path):
    from gnll.evaluation.run.runner import Evaluator

    class ServerLike(FakeModel):
        capabilities = Capabilities(beams=False, sampling_logprobs=False)

    data = make_data_dir(tmp_path / "data")
    kw = dict(beams=0, measures=["pe", "g-nll"], sample_logprobs="sampling")
    with pytest.raises(ValueError, match="--sample_logprobs sampling needs"):
        Evaluator(cfg(data, tmp_path / "run", **kw), model=ServerLike())
    # the same run with model log-probs, or without sampled measures, is fine
    Evaluator(cfg(data, tmp_path / "ok", **{**kw, "sample_logprobs": "model"}), model=ServerLike())
    Evaluator(cfg(data, tmp_path / "ok2", **{**kw, "measures": ["g-nll"]}), model=ServerLike())


def test_no_surface_reports_negative_zero():
    from gnll.policy import AbstentionPolicy, uncertainty_record

    certain = Generation("a", [1], ["a"], [0.0], "eos")
    assert math.copysign(1.0, M.g_nll(certain)) == 1.0
    assert math.copysign(1.0, certain.logprob) == 1.0
    rec = uncertainty_record([0.0], decoding="greedy", policy=AbstentionPolicy())
    assert math.copysign(1.0, rec.g_nll) == 1.0
    assert math.copysign(1.0, rec.ln_g_nll) == 1.0


@pytest.mark.model
def test_ask_on_a_real_model_scores_an_empty_answer_by_its_stop_token(gemma):
    """The review's example: Gemma answers nothing; G-NLL is its stop token's, not -0.0."""
    from typer.testing import CliRunner

    from gnll.cli.main import app
    from gnll.evaluation.data.prompts import ask_prompt

    question = "Who was the man behind The Chipmunks?"
    [[g]] = gemma.generate([ask_prompt(question, long=False)], GenerationConfig.greedy())
    assert g.text == "" and g.terminator_logprobs  # the case under test
    res = CliRunner().invoke(app, ["ask", question, "--model", "gemma-3-270m", "--json"])
    assert res.exit_code == 0, res.output
    record = json.loads(res.stdout.strip().splitlines()[-1])
    assert record["answer"] == "" and record["token_logprobs"] == []
    assert record["stop_token_logprob"] == pytest.approx(g.terminator_logprobs[0], abs=1e-4)
    assert record["g_nll"] == pytest.approx(-g.terminator_logprobs[0], abs=1e-4)
    assert record["g_nll"] > 0


@pytest.mark.model
def test_real_beams_are_ranked_by_the_rule(gemma):
    """Both beam paths (gnll's loop and transformers' beams + ``rescore_beams``) on real weights."""
    from hf_helpers import variant

    from gnll.evaluation.data.prompts import ask_prompt

    prompts = [ask_prompt(q, long=False) for q in (
        "Who was the man behind The Chipmunks?",
        "What was the last US state to reintroduce alcohol after prohibition?",
    )]  # fmt: skip
    cfg = GenerationConfig.beam(4, max_new_tokens=12)
    n_empty = 0
    for model in (gemma, variant(gemma, beam_decoder="generate")):
        for beams in model.generate(prompts, cfg):
            lps = [b.logprob for b in beams]
            assert lps == sorted(lps, reverse=True)
            for b in beams:
                if not b.tokens:
                    n_empty += 1
                    assert b.logprob == pytest.approx(b.terminator_logprobs[0]) and b.logprob < 0
    assert n_empty > 0  # an empty beam was there to be ranked


# ------------------------------------------------- issue 39.3: the last exceptions to the rule
def test_sampled_empty_answer_is_scored_under_the_sampling_distribution(tiny_llama):
    """With --sample_logprobs sampling, every sample's tokens are scored under the tempered
    distribution: an empty sample too, by its stop token's tempered log-prob (before, its
    temperature-1 log-prob was mixed in)."""
    from transformers import AutoTokenizer

    from gnll.backends.base import DEFAULT_STOP
    from gnll.backends.hf.stopping import StopRules
    from gnll.evaluation.run.assemble import measure_logprobs

    tok = AutoTokenizer.from_pretrained(tiny_llama())
    rules = StopRules(tok, DEFAULT_STOP, {tok.eos_token_id})
    config = GenerationConfig.sample(2, temperature=0.5)
    raw, tempered = np.array([STOP_LP, -0.1]), np.array([-0.9, -0.2])
    gen = rules.split([tok.eos_token_id, tok.eos_token_id], raw, tempered, config)
    assert gen.text == "" and gen.terminator_logprobs == [STOP_LP]
    assert gen.sampling_logprobs == [-0.9]
    assert measure_logprobs(gen, sampling=True) == [-0.9]
    assert measure_logprobs(gen) == [STOP_LP]  # temperature 1, the default
    # A non-empty sample: its answer tokens only, tempered.
    ids = tok("Paris", add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
    lp = np.linspace(-1.0, -0.5, len(ids))
    full = rules.split(ids, lp, lp / 2, config)
    assert full.sampling_logprobs == (lp / 2)[: len(ids) - 1].tolist()
    # An empty sample whose tempered stop-token log-prob is unknown is refused, not mixed.
    with pytest.raises(EmptyAnswerError, match="sampling distribution"):
        measure_logprobs(replace(gen, sampling_logprobs=[]), sampling=True)


def test_vllm_greedy_processor_scores_an_empty_answer_by_its_stop_token(tiny_llama):
    """The Ray/vLLM greedy processor gives an empty answer the library's G-NLL and LN-G-NLL
    (its stop token's NLL, one token), not LN-G-NLL 0."""
    from gnll import load_model
    from gnll.distributed.vllm import VllmGreedy

    lm = load_model(str(tiny_llama()), progress=False)
    vg = VllmGreedy.from_model(lm, max_new_tokens=5)
    request = vg.preprocess({"id": 0, "question": "Say nothing."})
    eos = lm.tokenizer.eos_token_id
    row = {
        **{k: v for k, v in request.items() if k not in ("tokenized_prompt", "sampling_params")},
        "prompt_token_ids": request["tokenized_prompt"],
        "generated_tokens": [eos],
        "generated_text": "",
        "num_generated_tokens": 1,
        "logprobs": [{eos: {"logprob": STOP_LP, "rank": 1, "decoded_token": ""}}],
    }
    got = vg.postprocess(row)
    assert got["error"] is None and got["answer"] == "" and got["num_tokens"] == 0
    assert got["g_nll"] == M.g_nll([STOP_LP]) == -STOP_LP
    assert got["ln_g_nll"] == M.ln_g_nll([STOP_LP]) == -STOP_LP


def test_top_beam_is_ranked_not_taken_from_the_cache_order():
    """--reference beam ranks the cached beams by the rule instead of trusting their order (a cache
    written before the rule could hold an empty beam first, ranked with log-likelihood 0)."""
    from gnll.evaluation.run.stages import TopBeam

    beam = Generation("Paris", [7], ["Paris"], [-1.0], "stop", terminator_logprobs=[-0.1])

    class Beams:
        header = {"stage": "beams"}

        def generations(self, key):
            return [empty(), beam]  # the old order: the empty beam first

    assert TopBeam(Beams()).answer(("q", 0)) is beam


def test_a_cache_from_before_the_beam_rule_is_not_resumed(tmp_path):
    """The cache version is bumped with the rule: a resumed run of the older version is refused
    (its beams may have been ranked with an empty beam first), not silently continued."""
    from gnll.evaluation.run.runner import Evaluator, FingerprintMismatchError

    data = make_data_dir(tmp_path / "data")
    c = cfg(data, tmp_path / "run", tasks=["triviaqa_short"], beams=2, samples=0,
            measures=["g-nll", "bs-msp"])  # fmt: skip
    Evaluator(c, model=FakeModel()).run()
    fp = tmp_path / "run" / "tasks" / "triviaqa_short" / "fingerprint.json"
    old = json.loads(fp.read_text())
    fp.write_text(json.dumps({**old, "cache_version": 3}))
    with pytest.raises(FingerprintMismatchError, match="cache_version"):
        Evaluator(cfg(data, tmp_path / "run", tasks=["triviaqa_short"], beams=2, samples=0,
                      measures=["g-nll", "bs-msp"], resume=True), model=FakeModel()).run()  # fmt: skip
