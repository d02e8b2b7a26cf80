"""``gnll eval`` on Ray: the local runner, with each chunk's stage work computed on replicas.

The runner (:class:`~gnll.evaluation.run.runner.Evaluator`) describes each stage's work of a chunk
as a picklable :class:`~gnll.evaluation.run.stages.Work` (prompts, configuration, which
component) and takes a chunk mapper that computes those works and yields their records in order.
:class:`RayEvaluator` is that mapper on Ray: every replica (:class:`~.replicas.EvalReplica`) loads
the run's model, judges and clusterer as the local engine does, and an ordered actor pool runs the
works of a split's chunks in parallel, stage by stage. The driver loads no model; it appends the
records to the caches exactly as locally, so caches, ``samples.jsonl`` and ``results.json`` are
byte-identical to a local run with the same ``--chunk_size`` (chunks are the unit of
parallelism), and either engine resumes the other's directory.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from gnll.distributed.cluster import Cluster, require_ray, start_replicas
from gnll.distributed.replicas import EvalReplica
from gnll.evaluation.run.config import EvalConfig
from gnll.evaluation.run.runner import Evaluator
from gnll.evaluation.run.stages import StageResult, Work

__all__ = ["RayEvaluator"]


class RayEvaluator:
    """Runs an :class:`~gnll.evaluation.run.config.EvalConfig` with its model work on Ray replicas.

    Parameters
    ----------
    config:
        The run, as for the local engine (the engine is not part of it: the same configuration
        gives the same run directory and fingerprints on either engine, so either can resume it).
    cluster:
        Where the replicas run and how many there are.
    """

    def __init__(self, config: EvalConfig, *, cluster: Cluster) -> None:
        self.config, self.cluster = config, cluster
        # A whole split's chunks go through a stage together: the replicas share them out.
        self.evaluator = Evaluator(config, map_works=self.map_works, chunks_per_wave=None)
        self._actors: list[Any] | None = None

    @property
    def timer(self) -> Any:
        """The run's timings (``replicas``: time spent waiting for the replicas' work)."""
        return self.evaluator.timer

    def _replicas(self) -> list[Any]:
        """The replicas, started on first use (a run whose every stage is cached starts none)."""
        if self._actors is None:
            t = time.perf_counter()
            self._actors = start_replicas(
                EvalReplica, self.cluster, self.config, self.cluster.threads
            )
            self.evaluator.timed("load_model", time.perf_counter() - t)
        return self._actors

    def map_works(self, works: Sequence[Work]) -> Iterator[StageResult]:
        """The works' results, in order, computed on the replicas (as many at once as there are)."""
        require_ray()
        from ray.util import ActorPool

        pool = ActorPool(self._replicas())
        t = time.perf_counter()
        try:
            for kind, value in pool.map(lambda actor, w: actor.run.remote(w), list(works)):
                if kind == "raise":
                    raise value  # the work's own error, as the local run raises it
                yield value
        finally:
            self.evaluator.timed("replicas", time.perf_counter() - t)

    def run(self) -> dict[str, Any]:
        cfg = self.config
        try:
            if not (cfg.resume and Path(cfg.output_path).exists()):
                # A new run computes everything: the replicas load the model before the run
                # directory exists, so a mistyped --model leaves nothing behind (as locally).
                self._replicas()
            return self.evaluator.run()
        finally:
            if self._actors is not None:
                ray = require_ray()
                for a in self._actors:
                    ray.kill(a)
                self._actors = None
