"""Per-measure temperatures, sample log-probs under the sampling distribution, empty answers."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from fakes import FakeModel, cfg

from gnll import measures as M
from gnll.evaluation.run.runner import Evaluator
from gnll.evaluation.run.temperature import choose_temperatures


class TemperedFake(FakeModel):
    """Samples also carry their log-probs under the tempered distribution (like the hf backend)."""

    def generate(self, prompts, config=None, **kw):
        out = super().generate(prompts, config, **kw)
        if config is not None and config.strategy == "sample":
            t = config.temperature
            out = [
                [replace(g, sampling_logprobs=[x / t for x in g.token_logprobs]) for g in gens]
                for gens in out
            ]
        return out


class EmptyFake(FakeModel):
    """The greedy answer is empty (the model stops at once) for every third question."""

    def generate(self, prompts, config=None, **kw):
        out = super().generate(prompts, config, **kw)
        if config is not None and config.strategy == "greedy":
            for i, p in enumerate(prompts):
                if len(p) % 3 == 0:
                    out[i] = [
                        replace(
                            out[i][0],
                            text="",
                            token_ids=[],
                            tokens=[],
                            token_logprobs=[],
                            terminator_logprobs=[-3.0, -0.5],
                        )
                    ]
        return out


def _recs(path):
    return [json.loads(line) for line in (path / "samples.jsonl").open()]


def _samples_at(rec, temp):
    if rec["temperature"] == temp:
        return rec["samples"]
    return rec["samples_at"][f"{temp:g}"]


def test_each_sampling_measure_uses_its_own_held_out_temperature(data_dir, tmp_path):
    res = Evaluator(cfg(data_dir, tmp_path / "r", beams=0), model=FakeModel()).run()
    sel = res["tasks"]["triviaqa_short"]["temperature"]
    per = sel["per_measure"]
    assert sel["mode"] == "per-measure" and set(per) >= {"pe", "se", "mcp", "d-se"}
    cand = sel["candidates"]
    for m, t in per.items():  # each measure's choice is its own best held-out AUROC
        assert cand[f"{t:g}"]["auroc"][m] == max(c["auroc"][m] for c in cand.values())
    for rec in _recs(tmp_path / "r"):
        per = rec["measure_temperatures"]
        for m, t in per.items():
            s = _samples_at(rec, t)
            lps = [x["token_logprobs"] for x in s]
            ids = [x["cluster_id"] for x in s]
            want = M.compute([m], samples=lps, cluster_ids=ids)[m]
            assert rec["measures"][m] == pytest.approx(want)
    table = (tmp_path / "r" / "table.md").read_text()
    assert "T per measure" in table and "held-out, per-measure" in table


def test_shared_selection_is_judged_by_the_papers_baselines_only():
    """MCP (not a paper baseline) would favour T=1.0; the baselines favour T=0.5."""
    rows = [(True, 0.1), (False, 0.9), (True, 0.2), (False, 0.8)]

    def rec(t, c, s):
        good = s if t == 0.5 else -s
        return {
            "correctness": {"f1": {"correct": c}},
            "measures": {"pe": good, "se": good, "mcp": s if t == 1.0 else -s},
        }

    recs = {t: [rec(t, c, s) for c, s in rows] for t in (0.5, 1.0)}
    temps, info = choose_temperatures((0.5, 1.0), recs, "f1", ["pe", "se", "mcp"], "shared")
    assert temps == {"pe": 0.5, "se": 0.5, "mcp": 0.5} and info["mean_of"] == ["pe", "se"]
    temps, _ = choose_temperatures((0.5, 1.0), recs, "f1", ["pe", "se", "mcp"])
    assert temps == {"pe": 0.5, "se": 0.5, "mcp": 1.0}
    with pytest.raises(ValueError, match="temperature selection"):
        choose_temperatures((0.5,), recs, "f1", ["pe"], "best")


def test_sample_logprobs_under_the_sampling_distribution(data_dir, tmp_path):
    kw = dict(beams=0, temperature=0.5, measures=["pe", "se", "g-nll"])
    a = Evaluator(cfg(data_dir, tmp_path / "m", **kw), model=TemperedFake()).run()
    b = Evaluator(
        cfg(data_dir, tmp_path / "s", sample_logprobs="sampling", **kw), model=TemperedFake()
    ).run()
    assert a["config"]["sample_logprobs"] == "model"
    assert b["config"]["sample_logprobs"] == "sampling"
    for ra, rb in zip(_recs(tmp_path / "m"), _recs(tmp_path / "s"), strict=True):
        lps = [s["token_logprobs"] for s in ra["samples"]]
        tempered = [s["sampling_logprobs"] for s in rb["samples"]]
        assert ra["measures"]["pe"] == pytest.approx(M.predictive_entropy(lps))
        assert rb["measures"]["pe"] == pytest.approx(M.predictive_entropy(tempered))
        assert rb["measures"]["pe"] == pytest.approx(2 * ra["measures"]["pe"])  # T = 0.5
        assert ra["measures"]["g-nll"] == rb["measures"]["g-nll"]  # greedy is unaffected


def test_empty_answers_get_their_stop_tokens_log_prob(data_dir, tmp_path):
    kw = dict(beams=0, samples=0, measures=["g-nll", "ln-g-nll"])
    Evaluator(cfg(data_dir, tmp_path / "t", **kw), model=EmptyFake()).run()
    Evaluator(cfg(data_dir, tmp_path / "z", empty_answer="zero", **kw), model=EmptyFake()).run()
    n_empty = 0
    for rt, rz in zip(_recs(tmp_path / "t"), _recs(tmp_path / "z"), strict=True):
        if rt["greedy"]["token_ids"]:
            assert rt["measures"] == rz["measures"]
            continue
        n_empty += 1
        # the first terminator token (the stop token), as the reference code
        assert rt["measures"] == {"g-nll": 3.0, "ln-g-nll": 3.0}
        assert rz["measures"] == {"g-nll": 0.0, "ln-g-nll": 0.0}
    assert n_empty > 0


class ReversedBeams(FakeModel):
    """Beam search whose best beam is not the greedy answer: the beams reversed, the new first one
    made the most likely (the reference is ranked by log-likelihood, not taken from the order)."""

    def generate(self, prompts, config=None, **kw):
        from dataclasses import replace

        out = super().generate(prompts, config, **kw)
        if config is not None and config.strategy == "beam":
            out = [list(reversed(gens)) for gens in out]
            out = [
                [replace(gens[0], token_logprobs=[x / 100 for x in gens[0].token_logprobs])]
                + gens[1:]
                for gens in out
            ]
        return out


def test_reference_beam_judges_the_top_beam_and_scores_it(data_dir, tmp_path):
    from gnll.evaluation.results.correctness import f1_verdict

    kw = dict(samples=0, measures=["g-nll", "ln-g-nll"], beams=3, tasks=["triviaqa_short"])
    res = Evaluator(
        cfg(data_dir, tmp_path / "b", reference="beam", **kw), model=ReversedBeams()
    ).run()
    assert res["config"]["reference"] == "beam"
    differ = 0
    for rec in _recs(tmp_path / "b"):
        top = rec["reference"]
        assert top["text"] == rec["beams"][0]["text"]
        assert rec["measures"]["g-nll"] == pytest.approx(-sum(top["token_logprobs"]))
        want = f1_verdict(top["text"], rec["answers"]).correct
        assert rec["correctness"]["f1"]["correct"] == want
        differ += top["text"] != rec["greedy"]["text"]
    assert differ > 0  # the test means something: the top beam is not the greedy answer
    table = (tmp_path / "b" / "table.md").read_text()
    assert "Reference answer: the most likely of the K beams" in table
    with pytest.raises(ValueError, match="reference beam needs beams"):
        cfg(data_dir, tmp_path / "x", reference="beam", beams=0)
