"""The paper's Fig. 2 ablation: single-sequence NLL estimators against the number of candidates.

For each question the greedy answer is the reference whose correctness is judged (SQuAD F1 > 0.5, as in
the main evaluation). The uncertainty is the NLL of one output sequence found by

- greedy decoding (G-NLL; one candidate),
- beam search of width ``w`` for ``w = 1..K`` (the most likely beam),
- multinomial sampling at temperature ``tau``: the most likely of the first ``n`` of N samples,
  ``n = 1..N`` (``n = 1`` is "a single sample's NLL"),

and each estimator's AUROC is reported against its number of candidates. Better approximations of
the most likely sequence should score higher (Sec. 5.2). An empty answer, beam or sample is scored
(and ranked) by its stop token's log-prob, as everywhere in gnll
(:attr:`gnll.backends.Generation.measured_logprobs`).

The figure's reference lines are the paper's sampling-based baselines (PE, LN-PE, SE, LN-SE, D-SE)
"with their optimal hyperparameter settings": their scores come from a ``gnll eval`` run of the same
model and task (:func:`baseline_scores`, its per-measure held-out temperatures and its clusterer),
evaluated against the same greedy answers' correctness. :func:`average_ablations` averages several
runs (models) into one figure (gnll's reading of the caption's "Average AUROC", paper.tex:595).

Example
-------
``python scripts/fig2_ablation.py --model smollm2-135m-instruct --limit 100`` writes
``runs/fig2/ablation.png`` and its ``.json``; docs/evaluation.md has the commands of the committed
figure (both embedded models, baselines, averaged).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gnll import measures as M
from gnll.backends.base import GenerationConfig
from gnll.evaluation.results.correctness import f1_verdict
from gnll.evaluation.results.metrics import bootstrap_auroc

__all__ = [
    "BASELINES",
    "add_baselines",
    "average_ablations",
    "baseline_scores",
    "plot_ablation",
    "run_ablation",
]

#: The paper's sampling-based baselines, drawn as horizontal reference lines.
BASELINES = ("pe", "ln-pe", "se", "ln-se", "d-se")


def baseline_scores(samples_path: str | Path, task: str) -> dict[str, dict[str, float]]:
    """Per question id, the baselines' uncertainty scores from a ``gnll eval`` run's ``samples.jsonl``."""
    import json

    out = {}
    with open(samples_path, encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            if rec["task"] == task:
                out[str(rec["id"])] = {
                    m: rec["measures"][m] for m in BASELINES if m in rec["measures"]
                }
    if not out:
        raise ValueError(f"{samples_path}: no records of task {task!r}")
    return out


def run_ablation(
    model: Any,
    task_data: Any,
    *,
    limit: int = 100,
    widths: Sequence[int] = (1, 2, 3, 4, 5),
    temperatures: Sequence[float] = (0.1, 0.5, 1.0),
    samples: int = 10,
    seed: int = 0,
    baselines: dict[str, dict[str, float]] | None = None,
) -> dict[str, Any]:
    """AUROC of each single-sequence NLL estimator per number of candidates (see module docstring).

    ``baselines``: :func:`baseline_scores` of a ``gnll eval`` run that covers every question here;
    their AUROCs against the same correctness become the figure's reference lines.
    """
    examples = task_data.split("eval", limit)
    prompts = [task_data.prompt(e) for e in examples]
    max_new = task_data.task.max_new_tokens
    greedy = [
        g[0] for g in model.generate(prompts, GenerationConfig.greedy(max_new_tokens=max_new))
    ]
    correct = [
        float(bool(f1_verdict(g.text, e.answers, e.numeric_answer).correct))
        for g, e in zip(greedy, examples, strict=True)
    ]
    # Per estimator and number of candidates, each question's NLL of the sequence it found.
    nll: dict[str, dict[str, list[float]]] = {
        "greedy": {"1": [M.g_nll(g.measured_logprobs) for g in greedy]}
    }
    if widths and not model.capabilities.missing(["beams"]):
        nll["beam search"] = {}
        for w in widths:
            cfg = GenerationConfig.beam(w, max_new_tokens=max_new, seed=None)
            gens = model.generate(prompts, cfg)
            nll["beam search"][str(w)] = [
                M.msp_estimate([g.measured_logprobs for g in gs]) for gs in gens
            ]
    for tau in temperatures:
        cfg = GenerationConfig.sample(samples, temperature=tau, max_new_tokens=max_new, seed=seed)
        gens = model.generate(prompts, cfg)
        nll[f"sampling T={tau:g}"] = {
            str(n): [M.msp_estimate([g.measured_logprobs for g in gs[:n]]) for gs in gens]
            for n in range(1, samples + 1)
        }
    # The AUROC and its bootstrap standard error, as the main evaluation reports them.
    fits = {
        name: {k: bootstrap_auroc(correct, scores, seed=seed) for k, scores in curve.items()}
        for name, curve in nll.items()
    }
    out = {
        "task": task_data.task.name,
        "n": len(examples),
        "accuracy": sum(correct) / len(correct) if correct else float("nan"),
        "correctness": "f1 > 0.5 of the greedy answer",
        # Per question, so that baselines can be scored against the same verdicts afterwards
        # (:func:`add_baselines`), from a ``gnll eval`` run made at the same time.
        "ids": [str(e.id) for e in examples],
        "correct": correct,
        "auroc": {name: {k: a for k, (a, _se) in fit.items()} for name, fit in fits.items()},
        "auroc_se": {name: {k: se for k, (_a, se) in fit.items()} for name, fit in fits.items()},
    }
    if baselines is not None:
        add_baselines(out, baselines, seed=seed)
    return out


def add_baselines(
    result: dict[str, Any], baselines: dict[str, dict[str, float]], *, seed: int = 0
) -> dict[str, Any]:
    """Score the baselines of a ``gnll eval`` run (:func:`baseline_scores`) against the greedy
    answers' correctness recorded in ``result`` (its ``ids`` and ``correct``), in place.

    So an ablation and its baseline run can be made side by side and joined afterwards
    (``scripts/fig2_ablation.py --result``).
    """
    ids, correct = result["ids"], result["correct"]
    missing = [i for i in ids if str(i) not in baselines]
    if missing:
        raise ValueError(
            f"the baseline run lacks {len(missing)} of the {len(ids)} questions "
            f"(first: id {missing[0]}): run `gnll eval` on the same task with at least "
            f"--limit {len(ids)} and the same --seed"
        )
    fit = {
        m: bootstrap_auroc(correct, [baselines[str(i)][m] for i in ids], seed=seed)
        for m in BASELINES
        if all(m in baselines[str(i)] for i in ids)
    }
    result["baselines"] = {m: a for m, (a, _se) in fit.items()}
    result["baselines_se"] = {m: se for m, (_a, se) in fit.items()}
    return result


def average_ablations(results: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The mean of several ablations (models or runs): gnll's reading of Fig. 2's "Average AUROC".

    Every AUROC is the mean over the runs that have it for all of them (an estimator or candidate
    count missing from one run is left out); standard errors combine as sqrt(sum SE^2) / k.
    """
    if not results:
        raise ValueError("no ablation results to average")
    k = len(results)

    def mean(tables: list[dict[str, float]]) -> dict[str, float]:
        keys = [x for x in tables[0] if all(x in t for t in tables)]
        return {x: sum(t[x] for t in tables) / k for x in keys}

    def combined(tables: list[dict[str, float | None]]) -> dict[str, float | None]:
        keys = [x for x in tables[0] if all(x in t for t in tables)]
        return {
            x: None
            if any(t[x] is None for t in tables)
            else (sum(t[x] ** 2 for t in tables) ** 0.5) / k
            for x in keys
        }

    names = [n for n in results[0]["auroc"] if all(n in r["auroc"] for r in results)]
    out: dict[str, Any] = {
        "task": " / ".join(dict.fromkeys(r["task"] for r in results)),
        "n": sum(r["n"] for r in results),
        "runs": [{"model": r.get("model"), "task": r["task"], "n": r["n"]} for r in results],
        "accuracy": sum(r["accuracy"] for r in results) / k,
        "correctness": results[0]["correctness"],
        "auroc": {n: mean([r["auroc"][n] for r in results]) for n in names},
        "auroc_se": {n: combined([r["auroc_se"][n] for r in results]) for n in names},
    }
    if all("baselines" in r for r in results):
        out["baselines"] = mean([r["baselines"] for r in results])
        out["baselines_se"] = combined([r["baselines_se"] for r in results])
    return out


#: Colour and dash pattern of each baseline line (PE, LN-PE, SE, LN-SE, D-SE), apart from the
#: estimator curves' default colours.
BASELINE_STYLES = (
    ("#555555", (0, (6, 2))),
    ("#8c564b", (0, (1, 1.5))),
    ("#0e7c86", (0, (4, 1.5, 1, 1.5))),
    ("#8a7f00", (0, (2.5, 2.5))),
    ("#c2249f", (0, (7, 1.5, 1, 1.5, 1, 1.5))),
)


def _spread(values: Sequence[float], gap: float) -> list[float]:
    """Label heights for ``values``: each at its value, pushed apart to at least ``gap``."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    out = [0.0] * len(values)
    last = -math.inf
    for i in order:
        out[i] = max(values[i], last + gap)
        last = out[i]
    return out


def plot_ablation(result: dict[str, Any], path: str | Path, title: str = "") -> Path:
    """AUROC against the number of candidates, one line per estimator (greedy a single point)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.2, 4.2))
    for name, curve in result["auroc"].items():
        xs = [int(k) for k in curve]
        ys = [curve[k] for k in curve]
        style = (
            {"marker": "*", "markersize": 12, "linestyle": "none"}
            if name == "greedy"
            else {"marker": "o"}
        )
        ax.plot(xs, ys, label="greedy (G-NLL)" if name == "greedy" else name, **style)
    # The baselines use N samples at their own best temperature whatever the x axis says: lines,
    # each its own colour and dash pattern, labelled at the right edge (spread apart where lines
    # nearly coincide), so that overlapping lines stay identifiable.
    lines = [(m, v) for m, v in (result.get("baselines") or {}).items() if v is not None]
    if lines:
        xmax = max((int(k) for curve in result["auroc"].values() for k in curve), default=1)
        ax.set_xlim(right=xmax + 1.6)
        for (m, value), (color, dash) in zip(lines, BASELINE_STYLES, strict=False):
            ax.axhline(value, color=color, lw=1.1, ls=dash, label=M.get(m).label)
        for (m, value), y in zip(lines, _spread([v for _m, v in lines], 0.013), strict=True):
            color = BASELINE_STYLES[[n for n, _v in lines].index(m) % len(BASELINE_STYLES)][0]
            ax.annotate(
                f"{M.get(m).label} {value:.3f}".replace("0.", ".", 1),
                xy=(xmax + 0.2, y),
                fontsize=7,
                color=color,
                va="center",
                bbox={"facecolor": "white", "edgecolor": "none", "pad": 0.6},
            )
    ax.set_xlabel("candidates (beam width / samples)")
    ax.set_ylabel("AUROC")
    ax.set_title(title or f"{result['task']}, n={result['n']}: NLL of one sequence")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
