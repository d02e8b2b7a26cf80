"""Scoring answers that already exist: teacher-forced NLL, ``is_greedy``, and the ``gnll score`` job.

:func:`score` is the Python API (``gnll.score(model, prompts, answers)``); :func:`run_score_job`
streams a JSONL/CSV/Parquet file through a model for the ``gnll score`` command.
"""

from gnll.scoring.api import ScoringError, score
from gnll.scoring.stream import ScoreJob, ScoreSummary, build_score_job, run_score_job

__all__ = [
    "ScoreJob",
    "ScoreSummary",
    "ScoringError",
    "build_score_job",
    "run_score_job",
    "score",
]
