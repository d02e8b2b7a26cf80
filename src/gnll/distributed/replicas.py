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
from typing import Any

from gnll.backends.base import GenerationErrors, Model
from gnll.scoring.rows import Row
from gnll.scoring.stream import ChunkResult, ScoreJob, score_chunk

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
    """A ``gnll eval`` replica: the model, judge and clusterer of the run, loaded as locally.

    It holds its own :class:`~gnll.evaluation.run.runner.Evaluator` of the same configuration (writing
    only to a scratch directory) and answers the driver's calls with its components.
    """

    def __init__(self, config: Any, threads: int) -> None:
        from gnll.evaluation.run.runner import Evaluator

        set_threads(threads)
        scratch = tempfile.mkdtemp(prefix="gnll-replica-")
        self.ev = Evaluator(dataclasses.replace(config, output_path=scratch, progress=False))
        self.ev.model  # noqa: B018  (load now: a model that cannot load fails at start-up)

    def ready(self) -> dict[str, Any]:
        return self.describe("model")

    def describe(self, role: str) -> dict[str, Any]:
        obj = getattr(self.ev, role)
        return {
            "name": getattr(obj, "name", role),
            "capabilities": getattr(obj, "capabilities", None),
            "info": obj.info() if hasattr(obj, "info") else {},
        }

    def call(self, what: str, role: str, *args: Any) -> tuple[str, Any, Any]:
        """``("ok", result, rendered)``, ``("partial", GenerationErrors, rendered)`` or
        ``("raise", exception, None)``: an error of the work itself goes back to the driver as a
        value, so it is raised there as the local run would raise it."""
        try:
            if what == "cluster_many":
                return "ok", self.ev.clusterer.cluster_many(*args), None
            model = self.ev.model if role == "model" else self.ev.judge
            prompts, config, batch_size = args
            rendered = [model.render_prompt(p) for p in prompts]
            try:
                gens = model.generate(prompts, config, batch_size=batch_size)
            except GenerationErrors as e:
                return "partial", (e.results, e.errors), rendered
            return "ok", gens, rendered
        except Exception as e:  # noqa: BLE001  (re-raised by the driver)
            return "raise", portable(e), None


def portable(e: Exception) -> Exception:
    """``e`` if it survives pickling (to be raised in the driver as it is), else its message."""
    import pickle

    try:
        pickle.loads(pickle.dumps(e))
    except Exception:  # noqa: BLE001
        return RuntimeError(f"{type(e).__name__}: {e}")
    return e
