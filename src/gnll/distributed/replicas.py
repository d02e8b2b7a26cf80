"""What runs inside a Ray replica: one model, loaded once, scoring chunks or answering eval calls.

The classes are plain Python (Ray makes actors of them in :mod:`.cluster`, and Ray Data's
``map_batches`` instantiates :class:`ScoreBatches` once per actor), so they run the very code of
the local engine: :func:`gnll.scoring.stream.score_chunk` and the evaluation's own model, judge and
clusterer loaders.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from gnll.backends.base import Model
from gnll.scoring.rows import Row
from gnll.scoring.stream import ChunkResult, ScoreJob, score_chunk

if TYPE_CHECKING:
    from gnll.evaluation.run.stages import Work

__all__ = ["EvalReplica", "ScoreReplica", "load", "set_threads"]

#: A model to load in each replica: a name for :func:`gnll.load_model`, or a zero-argument factory.
ModelSpec = str | Callable[[], Model]


def set_threads(threads: int | None) -> None:
    """Pin torch's intra-op threads (a replica uses the cores it reserved, no more)."""
    if threads:
        import torch

        torch.set_num_threads(int(threads))


def load(model: ModelSpec, model_args: dict[str, Any] | None = None) -> Model:
    """Load ``model`` as the local engine would (no progress spinner in a replica)."""
    if callable(model):
        return model()
    from gnll.backends import load_model

    return load_model(model, progress=False, **(model_args or {}))


class ScoreReplica:
    """A ``gnll score`` replica: :meth:`score_chunk` is the local engine's step on one chunk."""

    def __init__(
        self, model: ModelSpec, model_args: dict[str, Any] | None, job: ScoreJob, threads: int
    ) -> None:
        set_threads(threads)
        self.model = load(model, model_args)
        self.job = dataclasses.replace(job, progress=False).for_model(self.model)

    def ready(self) -> dict[str, Any]:
        return {"name": self.model.name}

    def score_chunk(self, chunk: list[Row], start: int) -> ChunkResult:
        return score_chunk(self.model, self.job, chunk, start)


class EvalReplica:
    """A ``gnll eval`` replica: the run's model, judges and clusterer, loaded as locally.

    It holds an :class:`~gnll.evaluation.run.runner.Evaluator` of the same configuration (writing
    only to a scratch directory) as the components a stage's
    :class:`~gnll.evaluation.run.stages.Work` computes with.
    """

    def __init__(self, config: Any, threads: int) -> None:
        from gnll.evaluation.run.runner import Evaluator

        set_threads(threads)
        scratch = tempfile.mkdtemp(prefix="gnll-replica-")
        self.components = Evaluator(
            dataclasses.replace(config, output_path=scratch, progress=False)
        )
        self.components.model  # noqa: B018  (load now: a model that cannot load fails at start-up)

    def ready(self) -> dict[str, Any]:
        return {"name": self.components.model.name}

    def run(self, work: Work) -> tuple[str, Any]:
        """``("ok", StageResult)`` or ``("raise", exception)``: an error of the work itself goes
        back to the driver as a value, so it is raised there as the local run would raise it."""
        try:
            return "ok", work.run(self.components)
        except Exception as e:  # noqa: BLE001  (re-raised by the driver)
            return "raise", portable(e)


def portable(e: Exception) -> Exception:
    """``e`` if it survives pickling (to be raised in the driver as it is), else its message."""
    import pickle

    try:
        pickle.loads(pickle.dumps(e))
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(e).__name__}: {e}")
    return e
