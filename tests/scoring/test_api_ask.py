"""``gnll.ask``: the one-call pipeline of ``gnll ask`` as a library function, on a scripted model."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest
from typer.testing import CliRunner

import gnll
from gnll import measures as M
from gnll.backends.base import Capabilities, Generation, GenerationConfig, Model
from gnll.calibration import Calibrator
from gnll.evaluation.data.prompts import ask_prompt
from gnll.scoring.asking import AskOptionError, AskResult, ask

SAMPLE_TEXTS = ["Paris", "Lyon", "Paris", "Nice"]


class ScriptedModel(Model):
    """Greedy 'Paris'; beams and samples from fixed lists; counts the calls per strategy."""

    capabilities = Capabilities()  # beams, scoring, terminator, tempered log-probs

    name = "scripted"

    def __init__(self) -> None:
        self.calls: Counter = Counter()
        self.prompts: list[str] = []

    def generate(self, prompts, config=None, *, batch_size=None, progress=False):
        config = config or GenerationConfig()
        self.calls[config.strategy] += 1
        self.prompts += list(prompts)
        out = []
        for _p in prompts:
            if config.strategy == "greedy":
                gens = [Generation("Paris", [5, 6], ["Par", "is"], [-0.1, -0.3], "stop")]
            elif config.strategy == "beam":
                gens = [
                    Generation(f"b{j}", [j], [f"b{j}"], [-0.2 * (j + 1)], "stop")
                    for j in range(config.num_sequences)
                ]
            else:
                gens = [
                    Generation(SAMPLE_TEXTS[j % 4], [j], [SAMPLE_TEXTS[j % 4]], [-0.5 - j], "stop")
                    for j in range(config.num_sequences)
                ]
            out.append(gens)
        return out

    def render_prompt(self, prompt: str) -> str:
        return prompt

    def score(self, prompts, answers, **kwargs):  # pragma: no cover - ask does not score
        raise NotImplementedError


def test_ask_computes_gnll_from_the_greedy_answer_and_generates_nothing_else():
    model = ScriptedModel()
    result = ask(model, "What is the capital of France?")
    assert isinstance(result, AskResult)
    assert result.answer == "Paris" and result.model == "scripted"
    assert result.measures == {"g-nll": pytest.approx(0.4)}
    assert dict(model.calls) == {"greedy": 1}
    assert model.prompts == [ask_prompt("What is the capital of France?", long=False)]
    assert result.samples is None and result.beams is None and result.cluster_ids is None


def test_ask_generates_what_each_measure_needs_and_clusters_the_samples():
    model = ScriptedModel()
    result = gnll.ask(model, "Q?", measures="pe,se,bs-msp", samples=4, beams=3, clusterer="exact")
    assert list(result.measures) == ["g-nll", "pe", "se", "bs-msp"]  # G-NLL always comes first
    assert dict(model.calls) == {"greedy": 1, "beam": 1, "sample": 1}
    assert [g.text for g in result.samples] == SAMPLE_TEXTS
    assert len(result.beams) == 3
    # exact matching: Paris, Lyon, Paris, Nice -> three clusters, the two Paris answers together
    ids = result.cluster_ids
    assert ids[0] == ids[2] and len(set(ids)) == 3
    # the measures are the registry's, computed on exactly these generations
    expected = M.compute(
        ["g-nll", "pe", "se", "bs-msp"], result.greedy, result.beams, result.samples, ids
    )
    assert result.measures == pytest.approx(expected)
    assert result.measures["pe"] == pytest.approx(np.mean([0.5, 1.5, 2.5, 3.5]))


def test_ask_refuses_impossible_options_and_unknown_measures_before_generating():
    model = ScriptedModel()
    with pytest.raises(AskOptionError) as err:
        ask(model, "Q?", measures=["pe"], samples=0)
    assert err.value.option == "samples"
    with pytest.raises(AskOptionError, match="temperature"):
        ask(model, "Q?", temperature=math.nan)
    with pytest.raises(ValueError, match="bogus"):
        ask(model, "Q?", measures="g-nll,bogus")
    assert not model.calls


def test_ask_with_a_calibrator_adds_p_correct_and_abstain():
    rng = np.random.default_rng(0)
    scores = rng.uniform(0, 3, 200)
    labels = (rng.uniform(0, 3, 200) > scores).astype(int)  # low G-NLL tends to be correct
    cal = Calibrator(target_coverage=None).fit(scores, labels)
    result = ask(ScriptedModel(), "Q?", calibration=cal)
    assert result.p_correct == pytest.approx(float(cal.predict_proba([0.4])[0]))
    assert result.abstain == bool(cal.abstain([0.4])[0])
    # G-NLL is always computed, so a G-NLL calibration works whatever else is asked for
    assert ask(ScriptedModel(), "Q?", measures=["pe"], calibration=cal).p_correct is not None
    cal.meta["measure"] = "pe"
    model = ScriptedModel()
    with pytest.raises(ValueError, match="'pe'"):
        ask(model, "Q?", calibration=cal)
    assert not model.calls  # refused before the greedy pass


def test_cli_ask_json_is_the_library_result(monkeypatch):
    from gnll.cli.main import app

    monkeypatch.setattr("gnll.load_model", lambda name, **kw: ScriptedModel())
    args = ["ask", "Q?", "--json", "--measures", "g-nll,pe", "--samples", "4"]
    out = CliRunner().invoke(app, args)
    assert out.exit_code == 0, out.output
    printed = json.loads(out.stdout)
    expected = ask(ScriptedModel(), "Q?", measures=["g-nll", "pe"], samples=4).to_dict()
    assert printed == json.loads(json.dumps(expected))
    assert printed["samples"] == SAMPLE_TEXTS and printed["g_nll"] == pytest.approx(0.4)


def test_ask_loads_a_model_given_by_name(monkeypatch):
    loaded = []

    def load(name, **kwargs):
        loaded.append((name, kwargs))
        return ScriptedModel()

    monkeypatch.setattr("gnll.backends.load_model", load)
    assert gnll.ask("some-model", "Q?").answer == "Paris"
    assert loaded == [("some-model", {"progress": False})]
