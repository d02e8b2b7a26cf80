"""gnll past one machine, on Ray: ``gnll score`` and ``gnll eval`` sharded over model replicas.

Ray is an optional extra (``pip install 'gnll[ray]'``); nothing is imported until used, and the
local engine never needs it.

- :func:`score` -- a Ray Dataset of (prompt, answer) rows scored by an actor pool (Ray Data);
- :func:`~gnll.distributed.scoring.run_score_job` -- ``gnll score --engine ray``;
- :class:`~gnll.distributed.evaluation.RayEvaluator` -- ``gnll eval --engine ray``;
- :mod:`~gnll.distributed.vllm` -- pre/post-processors for ``ray.data.llm``'s vLLM processor.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Cluster", "RayEvaluator", "RayUnavailable", "score"]


def __getattr__(name: str) -> Any:  # lazy: importing gnll.distributed does not import ray
    if name in ("Cluster", "RayUnavailable"):
        from gnll.distributed import cluster

        return getattr(cluster, name)
    if name == "score":
        from gnll.distributed.scoring import score

        return score
    if name == "RayEvaluator":
        from gnll.distributed.evaluation import RayEvaluator

        return RayEvaluator
    raise AttributeError(name)
