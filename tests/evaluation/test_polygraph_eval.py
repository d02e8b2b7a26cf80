"""LM-Polygraph's numbers in a run: the ``g-nll+eos`` column and the PRR metrics in results.json.

``g-nll+eos`` (LM-Polygraph's ``MaximumSequenceProbability`` definition) is G-NLL plus the NLL of
the token(s) that ended the greedy answer; it is computed only when asked for by name, so default
runs and tables are unchanged. ``results.json`` records LM-Polygraph's PRR numbers beside AUROC.
"""

from __future__ import annotations

import json
import math

import pytest
from fakes import FakeModel, GreedyEdited, cfg

from gnll import measures as M
from gnll.backends.base import Generation
from gnll.evaluation.results.metrics import prr_metrics
from gnll.evaluation.run.runner import EvalConfig, Evaluator


class TerminatedModel(GreedyEdited):
    """The fake model with a terminator log-prob that varies per question; every fifth greedy answer
    is cut by max_new_tokens (no terminator) and every seventh is empty (a two-token stop string)."""

    def edit(self, g, k):
        g.terminator_logprobs = [-0.05 - (k % 13) / 10, -0.02]
        g.terminator_token_ids = [198, 199]
        if k % 5 == 0:
            g.finish_reason, g.stop_sequence = "length", None
            g.terminator_logprobs, g.terminator_token_ids = [], []
        elif k % 7 == 0:
            g.text, g.token_ids, g.tokens, g.token_logprobs = "", [], [], []


#: The names results.json gives LM-Polygraph's PRR numbers (as docs/evaluation.md lists them).
PRR_KEYS = ("prr", "prr_normalized", "prr_0.5", "prr_0.5_normalized")


def _expected_eos(greedy: dict) -> float:
    """LM-Polygraph's MSP of a stored greedy answer: every answer and terminator token, once."""
    return -(sum(greedy["token_logprobs"]) + sum(greedy["terminator_logprobs"]))


def _records(run):
    return [json.loads(line) for line in (run / "samples.jsonl").open()]


def test_eval_computes_g_nll_eos_per_question(data_dir, tmp_path):
    run = tmp_path / "run"
    config = cfg(data_dir, run, measures=["g-nll", "g-nll+eos"], beams=0, samples=0)
    res = Evaluator(config, model=TerminatedModel()).run()
    recs = _records(run)
    kinds = {"stop": 0, "length": 0, "empty": 0}
    for r in recs:
        g, m = r["greedy"], r["measures"]
        assert list(m) == ["g-nll", "g-nll+eos"]
        assert m["g-nll+eos"] == pytest.approx(_expected_eos(g), abs=1e-12)  # same path: float64 formula on the same log-probs
        if g["finish_reason"] == "length":  # no terminator: nothing to add (as LM-Polygraph)
            kinds["length"] += 1
            assert m["g-nll+eos"] == m["g-nll"]
        elif not g["token_ids"]:  # empty: G-NLL is the stop token's NLL, +eos the whole stop string
            kinds["empty"] += 1
            assert m["g-nll"] == pytest.approx(-g["terminator_logprobs"][0])
            assert m["g-nll+eos"] == pytest.approx(-sum(g["terminator_logprobs"]))
        else:
            kinds["stop"] += 1
            assert m["g-nll+eos"] == pytest.approx(m["g-nll"] - sum(g["terminator_logprobs"]))
            assert m["g-nll+eos"] > m["g-nll"]
    assert all(kinds.values()), kinds  # every case occurred
    for task in res["tasks"].values():
        for mres in task["metrics"].values():
            assert set(mres["measures"]) == {"g-nll", "g-nll+eos"}
    table = (run / "table.md").read_text()
    assert "| G-NLL | LN-G-NLL | BS-MSP | G-NLL+EOS |" in table


def test_g_nll_eos_is_not_a_default_measure(data_dir, tmp_path):
    assert "g-nll+eos" not in M.validate("all")
    assert (
        "g-nll+eos"
        not in EvalConfig(model="m", tasks=["triviaqa_short"], output_path=tmp_path).measures
    )
    run = tmp_path / "run"
    Evaluator(cfg(data_dir, run, beams=0, samples=0), model=TerminatedModel()).run()
    assert all("g-nll+eos" not in r["measures"] for r in _records(run))
    assert "G-NLL+EOS" not in (run / "table.md").read_text()


def test_results_record_prr_metrics(data_dir, tmp_path):
    run = tmp_path / "run"
    config = cfg(data_dir, run, measures=["g-nll", "ln-g-nll", "g-nll+eos"], beams=0, samples=0)
    res = Evaluator(config, model=TerminatedModel()).run()
    recs = _records(run)
    on_disk = json.loads((run / "results.json").read_text())
    checked = 0
    for task, tres in on_disk["tasks"].items():
        for metric, mres in tres["metrics"].items():
            mine = [
                r
                for r in recs
                if r["task"] == task and r["correctness"][metric]["correct"] is not None
            ]
            quality = [float(r["correctness"][metric]["correct"]) for r in mine]
            assert 0 < sum(quality) < len(quality)  # both classes: PRR is informative
            for m, values in mres["measures"].items():
                want = prr_metrics([r["measures"][m] for r in mine], quality)
                for key in PRR_KEYS:
                    assert values[key] == pytest.approx(want[key], abs=1e-12), (task, m, key)  # same path: float64 formula on the same log-probs
                    checked += 1
                assert values["auroc"] is not None  # beside AUROC, which is unchanged
    rows = sum(len(tres["metrics"]) for tres in on_disk["tasks"].values())
    assert len(on_disk["tasks"]) == 2 and checked == rows * 3 * len(PRR_KEYS)
    assert res["tasks"] == on_disk["tasks"]


def test_prr_undefined_below_two_questions():
    from gnll.evaluation.results.report import PRR_KEYS as RECORDED
    from gnll.evaluation.results.report import _prr

    assert RECORDED == PRR_KEYS
    assert _prr([0.3], [1.0]) == dict.fromkeys(PRR_KEYS)
    assert not any(math.isnan(v) for v in _prr([0.3, 0.1], [1.0, 0.0]).values())


def test_ask_reports_g_nll_eos():
    from gnll.scoring.asking import ask

    class OneAnswer(FakeModel):
        def generate(self, prompts, config=None, *, batch_size=None, progress=False):
            return [
                [
                    Generation(
                        "Paris",
                        [7, 8],
                        ["Par", "is"],
                        [-0.5, -0.25],
                        "eos",
                        terminator_token_ids=[2],
                        terminator_logprobs=[-0.125],
                    )
                ]
            ]

    result = ask(OneAnswer(), "What is the capital of France?", measures=["g-nll", "g-nll+eos"])
    assert result.measures == {"g-nll": 0.75, "g-nll+eos": 0.875}

    # gnll generate --measures g-nll,g-nll+eos: one column per measure, "-" written "_"
    from gnll.scoring.generating import AskOptions, answer_chunk

    opts = AskOptions(measures=["g-nll", "g-nll+eos"])
    [row] = answer_chunk(OneAnswer(), opts, [(1, {"question": "Capital of France?"}, None)]).rows
    assert (row["g_nll"], row["g_nll+eos"]) == (0.75, 0.875)


def test_prr_table_section_is_optional(data_dir, tmp_path):
    from typer.testing import CliRunner

    from gnll.cli.main import app

    run = tmp_path / "run"
    config = cfg(data_dir, run, measures=["g-nll", "ln-g-nll"], beams=0, samples=0)
    res = Evaluator(config, model=TerminatedModel()).run()
    assert "PRR" not in (run / "table.md").read_text()  # the default table is unchanged
    plain = CliRunner().invoke(app, ["table", str(run)])
    out = CliRunner().invoke(app, ["table", str(run), "--prr"])
    assert plain.exit_code == 0 and out.exit_code == 0, out.output
    assert "PRR" not in plain.output
    head, section = out.output.split("## Normalised PRR", 1)
    assert head.rstrip("\n") == plain.output.rstrip("\n")  # the section is added at the end
    for task, tres in res["tasks"].items():
        mres = tres["metrics"]["f1"]  # the F1 row (each task's only metric here)
        assert list(tres["metrics"]) == ["f1"]
        row = section.split(f"| {task} | F1 |", 1)[1].split("\n")[0]
        shown = [c.strip().strip("*") for c in row.split("|") if c.strip() not in ("", "–")][2:]
        want = [f"{mres['measures'][m]['prr_normalized']:.3f}" for m in ("g-nll", "ln-g-nll")]
        assert [x.lstrip("0") for x in shown] == [w.lstrip("0") for w in want]
