"""The paper's Fig. 2 ablation: single-sequence NLL estimators against the number of candidates.

For each question the greedy answer is the reference whose correctness is judged (SQuAD F1 > 0.5, as in
the main evaluation). The uncertainty is the NLL of one output sequence found by

- greedy decoding (G-NLL; one candidate),
- beam search of width ``w`` for ``w = 1..K`` (the most likely beam),
- multinomial sampling at temperature ``tau``: the most likely of the first ``n`` of N samples,
  ``n = 1..N`` (``n = 1`` is "a single sample's NLL"),

and each estimator's AUROC is reported against its number of candidates. Better approximations of
the most likely sequence should score higher (Sec. 5.3).

Example
-------
``python scripts/fig2_ablation.py --model smollm2-135m-instruct --limit 100`` writes
``docs/img/fig2_ablation.png`` and its ``.json``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from gnll import measures as M
from gnll.backends.base import GenerationConfig
from gnll.evaluation.results.correctness import f1_verdict
from gnll.evaluation.results.metrics import bootstrap_auroc

__all__ = ["plot_ablation", "run_ablation"]


def run_ablation(
    model: Any,
    task_data: Any,
    *,
    limit: int = 100,
    widths: Sequence[int] = (1, 2, 3, 4, 5),
    temperatures: Sequence[float] = (0.1, 0.5, 1.0),
    samples: int = 10,
    seed: int = 0,
) -> dict[str, Any]:
    """AUROC of each single-sequence NLL estimator per number of candidates (see module docstring)."""
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
        "greedy": {"1": [M.g_nll(g.token_logprobs) for g in greedy]}
    }
    if widths and not model.capabilities.missing(["beams"]):
        nll["beam search"] = {}
        for w in widths:
            cfg = GenerationConfig.beam(w, max_new_tokens=max_new, seed=None)
            gens = model.generate(prompts, cfg)
            nll["beam search"][str(w)] = [
                M.msp_estimate([g.token_logprobs for g in gs]) for gs in gens
            ]
    for tau in temperatures:
        cfg = GenerationConfig.sample(samples, temperature=tau, max_new_tokens=max_new, seed=seed)
        gens = model.generate(prompts, cfg)
        nll[f"sampling T={tau:g}"] = {
            str(n): [M.msp_estimate([g.token_logprobs for g in gs[:n]]) for gs in gens]
            for n in range(1, samples + 1)
        }
    # The AUROC and its bootstrap standard error, as the main evaluation reports them.
    fits = {
        name: {k: bootstrap_auroc(correct, scores, seed=seed) for k, scores in curve.items()}
        for name, curve in nll.items()
    }
    return {
        "task": task_data.task.name,
        "n": len(examples),
        "accuracy": sum(correct) / len(correct) if correct else float("nan"),
        "correctness": "f1 > 0.5 of the greedy answer",
        "auroc": {name: {k: a for k, (a, _se) in fit.items()} for name, fit in fits.items()},
        "auroc_se": {name: {k: se for k, (_a, se) in fit.items()} for name, fit in fits.items()},
    }


def plot_ablation(result: dict[str, Any], path: str | Path, title: str = "") -> Path:
    """AUROC against the number of candidates, one line per estimator (greedy a single point)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.5, 3.8))
    for name, curve in result["auroc"].items():
        xs = [int(k) for k in curve]
        ys = [curve[k] for k in curve]
        style = (
            {"marker": "*", "markersize": 12, "linestyle": "none"}
            if name == "greedy"
            else {"marker": "o"}
        )
        ax.plot(xs, ys, label="greedy (G-NLL)" if name == "greedy" else name, **style)
    ax.set_xlabel("candidates (beam width / samples)")
    ax.set_ylabel("AUROC")
    ax.set_title(title or f"{result['task']}, n={result['n']}: NLL of one sequence")
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
