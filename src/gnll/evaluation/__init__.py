"""The paper's evaluation protocol: tasks, correctness, metrics, the cached runner, reports and plots.

Three wings (and the figures that only ``scripts/`` use); a lower wing never imports a higher one:

- :mod:`gnll.evaluation.data` -- what is asked:
  :mod:`~gnll.evaluation.data.datasets` (TriviaQA / SVAMP / NQ-Open loaders, original file formats),
  :mod:`~gnll.evaluation.data.records` (row checks), :mod:`~gnll.evaluation.data.prompts` and
  :mod:`~gnll.evaluation.data.tasks` (the registered tasks);
- :mod:`gnll.evaluation.results` -- what is reported:
  :mod:`~gnll.evaluation.results.correctness` (SQuAD F1, ``contains``, LLM-as-a-judge, agreement),
  :mod:`~gnll.evaluation.results.metrics` (AUROC with bootstrap SE, ARA@80, AURAC, paired test),
  :mod:`~gnll.evaluation.results.report` (``results.json``), :mod:`~gnll.evaluation.results.tables`
  (``table.md``), :mod:`~gnll.evaluation.results.plots` (PNGs);
- :mod:`gnll.evaluation.run` -- how it runs: :mod:`~gnll.evaluation.run.config` (:class:`EvalConfig`),
  :mod:`~gnll.evaluation.run.cache` and :mod:`~gnll.evaluation.run.store` (append-only JSONL stage
  caches, :class:`~gnll.evaluation.run.store.TaskRun`), :mod:`~gnll.evaluation.run.stages` (greedy,
  judge, beam, sample and cluster stages), :mod:`~gnll.evaluation.run.assemble` (``samples.jsonl``),
  :mod:`~gnll.evaluation.run.temperature`, and :mod:`~gnll.evaluation.run.runner`
  (:class:`Evaluator`, ``gnll eval``), which runs them in order;
- :mod:`gnll.evaluation.figures` -- the Fig. 2 ablation and a real model's next-token distributions.

The names below are importable from :mod:`gnll.evaluation` itself.

>>> from gnll.evaluation import EvalConfig
>>> EvalConfig(model="smollm2-135m-instruct", tasks=["svamp_short"], output_path="runs/x").beams
5
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "TASKS",
    "EvalConfig",
    "Evaluation",
    "Evaluator",
    "evaluate",
    "get_task",
    "render_table",
    "run_evaluation",
]


def __getattr__(name: str) -> Any:  # lazy: importing gnll.evaluation stays cheap
    if name in ("EvalConfig", "Evaluator", "run_evaluation"):
        from gnll.evaluation.run import runner

        return getattr(runner, name)
    if name in ("TASKS", "get_task"):
        from gnll.evaluation.data import tasks

        return getattr(tasks, name)
    if name in ("Evaluation", "evaluate"):
        from gnll.evaluation.run import simple

        return getattr(simple, name)
    if name == "render_table":
        from gnll.evaluation.results.tables import render_table

        return render_table
    raise AttributeError(f"module 'gnll.evaluation' has no attribute {name!r}")
