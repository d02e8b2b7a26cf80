"""``gnll.evaluate``: an evaluation in memory, returning its results (lm-eval's ``simple_evaluate``).

The same protocol as ``gnll eval`` (:class:`~gnll.evaluation.run.runner.Evaluator`), run in a
temporary directory that is removed afterwards: nothing is resumable and nothing is left on disk.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gnll._util.runfiles import iter_samples
from gnll.backends.base import Model
from gnll.evaluation.data.tasks import parse_task_list
from gnll.evaluation.results.tables import render_table
from gnll.evaluation.run.config import EvalConfig
from gnll.evaluation.run.runner import Evaluator

if TYPE_CHECKING:
    from gnll.semantic import Clusterer

__all__ = ["Evaluation", "evaluate"]


@dataclass
class Evaluation:
    """What an in-memory evaluation returns.

    Attributes
    ----------
    results
        The ``results.json`` dictionary (per task and correctness metric: accuracy, and per measure
        AUROC ± SE, ARA@80, AURAC; the configuration and library versions).
    samples
        The ``samples.jsonl`` records, one per question: prompt, answers, verdicts and measures.
    """

    results: dict[str, Any]
    samples: list[dict[str, Any]]

    def table(self, sections: Sequence[str] | None = None) -> str:
        """The ``table.md`` Markdown (or only ``sections`` of it, see :func:`render_table`)."""
        return render_table([self.results], sections=sections)


def evaluate(
    model: Model | str,
    tasks: str | Sequence[str],
    *,
    limit: int | None = None,
    judge: Model | str | None = None,
    clusterer: str | Clusterer = "auto",
    **options: Any,
) -> Evaluation:
    """Run the paper's evaluation protocol and return the results, with no run directory.

    Parameters
    ----------
    model
        A loaded model, or a name for :func:`gnll.load_model`.
    tasks
        Task names (or one comma-separated string) from :data:`gnll.evaluation.TASKS`.
    limit
        Questions per task (default: the task's whole evaluation pool).
    judge
        LLM-as-a-judge for long answers: a loaded model or a name.
    clusterer
        Semantic clusterer for SE and friends: a name (``auto``, ``exact``, ``embedding``, ``nli``,
        ``llm``) or a loaded clusterer.
    options
        Any other :class:`~gnll.evaluation.run.config.EvalConfig` field (``measures``, ``samples``,
        ``data_dir``, ``seed``, ...), except ``output_path`` and ``resume``.

    Returns
    -------
    Evaluation
        ``results`` (the ``results.json`` dictionary) and ``samples`` (the per-question records).

    Examples
    --------
    >>> from gnll import evaluate, load_model
    >>> model = load_model("smollm2-135m-instruct", progress=False)  # doctest: +SKIP
    >>> ev = evaluate(model, "svamp_short", limit=20, measures=["g-nll"])  # doctest: +SKIP
    >>> ev.results["tasks"]["svamp_short"]["metrics"]["f1"]["n"]  # doctest: +SKIP
    20
    >>> print(ev.table(sections=["auroc"]))  # doctest: +SKIP
    """
    for key in ("output_path", "resume"):
        if key in options:
            raise TypeError(f"evaluate() keeps no run directory, so it takes no {key!r}")
    task_list = [t.name for t in parse_task_list(tasks)] if isinstance(tasks, str) else list(tasks)
    model_name = model if isinstance(model, str) else model.name
    judge_name = judge if judge is None or isinstance(judge, str) else judge.name
    options.setdefault("plots", False)
    options.setdefault("progress", False)
    with tempfile.TemporaryDirectory(prefix="gnll-evaluate-") as tmp:
        config = EvalConfig(
            model=model_name,
            tasks=task_list,
            output_path=tmp,
            limit=limit,
            judge=judge_name,
            clusterer=clusterer if isinstance(clusterer, str) else "auto",
            **options,
        )
        evaluator = Evaluator(
            config,
            model=None if isinstance(model, str) else model,
            judge=None if judge is None or isinstance(judge, str) else judge,
            clusterer=None if isinstance(clusterer, str) else clusterer,
        )
        results = evaluator.run()
        samples = [record for _lineno, record in iter_samples(tmp)]
    return Evaluation(results=results, samples=samples)
