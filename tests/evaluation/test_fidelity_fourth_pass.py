"""Issue 50 (paper fidelity, fourth pass): PRR with ties, LM-Polygraph's non-finite uncertainties and
the answers on which ``g-nll+eos`` is not LM-Polygraph's MSP (EOS greedy at step 1 or 2)."""

from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pytest
from fakes import GreedyEdited, cfg

from gnll.evaluation.results.metrics import (
    auroc,
    prediction_rejection_area,
    prr_metrics,
    prr_order_dependent,
    rejection_accuracy,
    tie_averaged_prr,
)


def _dse_like(n: int = 200, seed: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """D-SE-like scores: five distinct values, 40% tied at 0, correctness related to the score."""
    rng = np.random.default_rng(seed)
    scores = rng.choice([0.0, 0.5, 0.9, 1.2, 1.6], size=n, p=[0.4, 0.2, 0.15, 0.15, 0.1])
    correct = (rng.random(n) < 0.55 - 0.2 * scores).astype(float)
    return scores, correct


# ------------------------------------------------------------------ 50.2: PRR with ties
def test_which_numbers_are_order_invariant():
    """The same 200 answers in 20 orders: LM-Polygraph's PRR of a tied measure moves (its sort
    breaks ties by position) while the tie-averaged PRR, ARA@80 and AUROC do not; with distinct
    scores the raw PRR is fixed too (the normalised one only by the random baseline's estimate)."""
    scores, correct = _dse_like()
    assert prr_order_dependent(scores, correct)
    rng = np.random.default_rng(0)
    seen: dict[str, list[float]] = {k: [] for k in ("lmp", "tied", "tied_raw", "ara", "auroc")}
    for _ in range(20):
        p = rng.permutation(len(scores))
        s, c = scores[p], correct[p]
        seen["lmp"].append(prr_metrics(s, c, n_random=50)["prr_normalized"])
        tied = tie_averaged_prr(s, c)
        seen["tied"].append(tied["prr_normalized"])
        seen["tied_raw"].append(tied["prr"])
        seen["ara"].append(rejection_accuracy(c, s))
        seen["auroc"].append(auroc(c, s))
    spread = {k: max(v) - min(v) for k, v in seen.items()}
    assert spread["lmp"] > 0.05, spread  # the order moves LM-Polygraph's number
    for key in ("tied", "tied_raw", "ara", "auroc"):
        assert spread[key] < 1e-12, (key, spread)

    distinct = scores + np.random.default_rng(1).random(len(scores)) * 1e-3
    assert not prr_order_dependent(distinct, correct)
    raw = []
    for _ in range(10):
        p = rng.permutation(len(scores))
        raw.append(prr_metrics(distinct[p], correct[p], n_random=50)["prr"])
        assert tie_averaged_prr(distinct[p], correct[p])["prr"] == pytest.approx(
            raw[-1], abs=1e-12
        )  # same path: one float64 formula on the same answers
    assert max(raw) - min(raw) < 1e-12


def test_tie_averaged_prr_is_the_mean_over_every_order():
    """Exhaustively: the mean of LM-Polygraph's PRR over all 7! orders of seven answers with two
    tie groups equals the tie-averaged PRR, and its normalised form uses the exact random mean."""
    ue = [0.2, 0.2, 0.2, 0.5, 0.9, 0.9, 0.1]
    q = [1.0, 0.0, 1.0, 1.0, 0.0, 1.0, 0.0]
    for max_rejection in (1.0, 0.5):
        areas = [
            prediction_rejection_area([ue[i] for i in p], [q[i] for i in p], max_rejection)
            for p in itertools.permutations(range(len(ue)))
        ]
        assert len(set(np.round(areas, 12))) > 1  # order-dependent
        got = tie_averaged_prr(ue, q, max_rejection)
        assert got["prr"] == pytest.approx(
            float(np.mean(areas)), abs=1e-12
        )  # same path: one float64 formula on the same answers
        oracle = prediction_rejection_area([-x for x in q], q, max_rejection)
        want = (got["prr"] - np.mean(q)) / (oracle - np.mean(q))
        assert got["prr_normalized"] == pytest.approx(
            want, abs=1e-12
        )  # same path: one float64 formula on the same answers


def test_prr_table_marks_order_dependent_cells_and_adds_the_tie_averaged_table():
    from gnll.evaluation.results.report import _prr, _prr_ties
    from gnll.evaluation.results.tables import render_table

    scores, correct = _dse_like()
    distinct = scores + np.arange(len(scores)) * 1e-6
    measures = {}
    for name, s in (("d-se", scores), ("g-nll", distinct)):
        measures[name] = {"auroc": auroc(correct, s), "auroc_se": 0.01}
        measures[name].update(_prr(s.tolist(), correct.tolist()))
        measures[name].update(_prr_ties(s.tolist(), correct.tolist()))
    assert measures["d-se"]["prr_order_dependent"] is True
    assert measures["g-nll"]["prr_order_dependent"] is False
    res = {
        "model": "m",
        "config": {},
        "tasks": {"t_short": {"mode": "short", "metrics": {"f1": {
            "n": 200, "accuracy": float(correct.mean()), "measures": measures}}}},
    }  # fmt: skip
    text = render_table([res], sections=["prr"])
    lmp, tied = text.split("## Normalised PRR, ties averaged", 1)
    row = next(line for line in lmp.splitlines() if line.startswith("| m | t_short"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    from gnll import measures as M

    first = len(cells) - len(M.ORDER)
    by = dict(zip(M.ORDER, cells[first:], strict=True))
    assert by["d-se"].endswith("†") and not by["g-nll"].endswith("†")
    assert "changes when the same answers come in another order" in lmp
    row = next(line for line in tied.splitlines() if line.startswith("| m | t_short"))
    assert "†" not in row
    want = measures["d-se"]["prr_normalized_tie_averaged"]
    assert f"{want:.3f}".lstrip("0") in row


# ------------------------------------------- 50.1: non-finite uncertainties, as UEManager
def test_non_finite_uncertainties_are_clipped_and_kept_as_lm_polygraph_does():
    """LM-Polygraph 0.7.0's ``UEManager`` (``_delete_nans``) clips a NaN or -inf uncertainty to
    -1e7 and +inf to +1e7 and keeps the answer; only NaN qualities are dropped. Numbers recorded
    from lm-polygraph 0.7.0 itself (its ``_delete_nans``, ``PredictionRejectionArea``,
    ``get_random_scores``, ``normalize_metric``). Before, gnll dropped the answer: 0.8033 / 0.7574."""
    nan = prr_metrics([0.1, math.nan, 0.5, 0.3, 0.7, 0.2], [1, 0, 1, 0, 0, 1])
    assert nan["prr"] == pytest.approx(
        0.4611111111111111, abs=1e-12
    )  # same path: float64 numpy on the same inputs as LM-Polygraph's
    assert nan["prr_normalized"] == pytest.approx(
        -0.1054120976299966, abs=1e-12
    )  # same path: float64 numpy on the same inputs as LM-Polygraph's
    assert nan["prr_0.5_normalized"] == pytest.approx(
        0.29971988795518206, abs=1e-12
    )  # same path: float64 numpy on the same inputs as LM-Polygraph's
    inf = prr_metrics([0.1, math.inf, 0.5, 0.3, 0.7, 0.2], [1, 1, 0, 0, 0, 1])
    assert inf["prr_normalized"] == pytest.approx(
        0.57567440684699, abs=1e-12
    )  # same path: float64 numpy on the same inputs as LM-Polygraph's
    assert inf["prr_0.5_normalized"] == pytest.approx(
        -0.30095403295750206, abs=1e-12
    )  # same path: float64 numpy on the same inputs as LM-Polygraph's
    # a NaN quality is left out, with its uncertainty
    dropped = prr_metrics([0.1, 0.9, 0.5, 0.3, 0.4], [1, 0, 1, 0, math.nan])
    assert dropped == prr_metrics([0.1, 0.9, 0.5, 0.3], [1, 0, 1, 0])
    with pytest.raises(ValueError, match="quality is infinite"):
        prr_metrics([0.1, 0.2], [1, math.inf])


# ------------------------------- 50.1: where g-nll+eos is not LM-Polygraph's MSP, counted
class EarlyEosModel(GreedyEdited):
    """Greedy answers end by EOS; every third is empty (EOS at step 1), every fourth one token
    long (EOS at step 2), the rest longer; one in five is cut by max_new_tokens instead."""

    def edit(self, g, k):
        g.finish_reason, g.stop_sequence = "eos", None
        g.terminator_token_ids, g.terminator_logprobs = [2], [-0.1 - (k % 7) / 10]
        if k % 5 == 0:
            g.finish_reason, g.terminator_token_ids, g.terminator_logprobs = "length", [], []
        elif k % 3 == 0:
            g.text, g.token_ids, g.tokens, g.token_logprobs = "", [], [], []
        elif k % 4 == 0:
            g.token_ids, g.tokens = g.token_ids[:1], g.tokens[:1]
            g.token_logprobs = g.token_logprobs[:1]
            g.text = g.tokens[0] if g.tokens else ""


def test_results_count_answers_with_eos_at_step_one_or_two(data_dir, tmp_path):
    from gnll.evaluation.run.runner import Evaluator

    run = tmp_path / "run"
    config = cfg(data_dir, run, measures=["g-nll", "g-nll+eos"], beams=0, samples=0)
    res = Evaluator(config, model=EarlyEosModel()).run()
    recs = [json.loads(line) for line in (run / "samples.jsonl").open()]
    counted = 0
    for task, tres in res["tasks"].items():
        for metric, mres in tres["metrics"].items():
            mine = [r for r in recs if r["task"] == task
                    and r["correctness"][metric]["correct"] is not None]  # fmt: skip
            want = sum(
                r["greedy"]["finish_reason"] == "eos" and len(r["greedy"]["token_ids"]) <= 1
                for r in mine
            )
            got = mres["measures"]["g-nll+eos"]["eos_at_step_le_2"]
            assert got == want
            counted += got
            assert "eos_at_step_le_2" not in mres["measures"]["g-nll"]
            assert 0 < got < len(mine)
    assert counted > 0


# ------------------------------------------------ 50.6: Fig. 2's baselines tell apart
def test_fig2_baselines_have_distinct_styles_and_direct_labels(tmp_path, monkeypatch):
    """Five baseline lines, three within .008 of each other (as on Gemma: SE .749, LN-SE .747,
    D-SE .754): each its own colour and dash pattern, and a label at the right edge, the labels
    pushed apart so none overlaps. Before, they were grey dashes told apart only by shade."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    from gnll.evaluation.figures.ablation import plot_ablation

    captured = {}

    def keep(self, *args, **kwargs):
        captured["fig"] = self

    monkeypatch.setattr(Figure, "savefig", keep)
    baselines = {"pe": 0.843, "ln-pe": 0.721, "se": 0.749, "ln-se": 0.747, "d-se": 0.754}
    result = {"task": "t", "n": 10, "auroc": {"greedy": {"1": 0.86}, "beam search":
              {"1": 0.86, "2": 0.85}}, "baselines": baselines}  # fmt: skip
    plot_ablation(result, tmp_path / "f.png")
    ax = captured["fig"].axes[0]
    flat = [ln for ln in ax.get_lines() if len(set(ln.get_ydata())) == 1 and
            ln.get_ydata()[0] in baselines.values()]  # fmt: skip
    assert len(flat) == 5
    assert len({ln.get_color() for ln in flat}) == 5
    assert len({str(ln._dash_pattern) for ln in flat}) == 5
    labels = {t.get_text().split()[0]: t.xy[1] for t in ax.texts}
    assert set(labels) == {"PE", "LN-PE", "SE", "LN-SE", "D-SE"}
    ys = sorted(labels.values())
    assert min(b - a for a, b in zip(ys, ys[1:], strict=False)) >= 0.0129
