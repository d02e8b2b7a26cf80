"""The paper's evaluation protocol: tasks, correctness, metrics, the cached runner, reports and plots.

Modules (lower ones never import higher ones):

- :mod:`~gnll.evaluation.datasets` -- TriviaQA / SVAMP / NQ-Open loaders (original file formats);
- :mod:`~gnll.evaluation.prompts`, :mod:`~gnll.evaluation.tasks` -- prompts and the registered tasks;
- :mod:`~gnll.evaluation.correctness` -- SQuAD F1, ``contains``, LLM-as-a-judge parsing, agreement;
- :mod:`~gnll.evaluation.metrics` -- AUROC with bootstrap SE, ARA@80, AURAC, paired bootstrap test;
- :mod:`~gnll.evaluation.config` -- :class:`EvalConfig`, what defines a run;
- :mod:`~gnll.evaluation.cache`, :mod:`~gnll.evaluation.store` -- append-only JSONL stage caches;
  :class:`~gnll.evaluation.store.TaskRun` (a task's directory, fingerprint and caches);
- :mod:`~gnll.evaluation.stages` -- greedy, judge, beam, sample and cluster stages;
- :mod:`~gnll.evaluation.assemble`, :mod:`~gnll.evaluation.temperature` -- ``samples.jsonl``
  records, held-out temperature choice;
- :mod:`~gnll.evaluation.runner` -- :class:`Evaluator` (``gnll eval``), which runs them in order;
- :mod:`~gnll.evaluation.report`, :mod:`~gnll.evaluation.plots` -- results.json, table.md, PNGs.

>>> from gnll.evaluation import EvalConfig
>>> EvalConfig(model="smollm2-135m-instruct", tasks=["svamp_short"], output_path="runs/x").beams
5
"""

from __future__ import annotations

from typing import Any

__all__ = ["TASKS", "EvalConfig", "Evaluator", "get_task", "render_table", "run_evaluation"]


def __getattr__(name: str) -> Any:  # lazy: importing gnll.evaluation stays cheap
    if name in ("EvalConfig", "Evaluator", "run_evaluation"):
        from gnll.evaluation import runner

        return getattr(runner, name)
    if name in ("TASKS", "get_task"):
        from gnll.evaluation import tasks

        return getattr(tasks, name)
    if name == "render_table":
        from gnll.evaluation.tables import render_table

        return render_table
    raise AttributeError(f"module 'gnll.evaluation' has no attribute {name!r}")
