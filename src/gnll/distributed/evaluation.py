"""``gnll eval`` on Ray: every stage of every chunk computed on replicas, outputs as a local run.

The local runner fills a chunk's stages one after another, each with one ``generate`` (or
``cluster_many``) call. :class:`RayEvaluator` runs the very same runner code in rounds. In a round,
each unfinished chunk runs until its next stage needs a model: that call is recorded instead of
made (the stage stops before it writes anything). The round's calls, one per chunk, go to the
replicas in parallel; in the next round each chunk replays its stage, the call answered with the
replica's result, and the stage appends its records exactly as locally, then runs up to its next
call. A call is the one the local run makes (the same prompts, configuration and batch size on
the same model code), so caches, ``samples.jsonl`` and ``results.json`` are byte-identical to a
local run with the same ``--chunk_size``; chunks are the unit of parallelism.
"""

from __future__ import annotations

import hashlib
import logging
import pickle
import time
from collections.abc import Sequence
from typing import Any

from gnll._util import progress_enabled
from gnll.backends.base import Generation, GenerationConfig, GenerationErrors, Model
from gnll.distributed.cluster import Cluster, require_ray, start_replicas
from gnll.distributed.replicas import EvalReplica
from gnll.evaluation.run.runner import Evaluator
from gnll.evaluation.run.stages import Chunk, TaskStages

logger = logging.getLogger(__name__)

__all__ = ["RayEvaluator"]


class _Deferred(Exception):
    """A stage reached a model call that is not computed yet (caught by the round loop)."""


class _Remote(Model):
    """The run's model (or judge) as the driver sees it: calls go through the evaluator's rounds."""

    def __init__(self, ev: RayEvaluator, role: str, described: dict[str, Any]) -> None:
        self.ev, self.role = ev, role
        self.name = described["name"]
        if described.get("capabilities") is not None:
            self.capabilities = described["capabilities"]
        self._info = described.get("info") or {"name": self.name}
        self.rendered: dict[str, str] = {}

    def info(self) -> dict[str, Any]:
        return self._info

    def generate(
        self,
        prompts: Sequence[str],
        config: GenerationConfig | None = None,
        *,
        batch_size: int | None = None,
        progress: Any = False,
    ) -> list[list[Generation]]:
        config = config or GenerationConfig.greedy()
        kind, value, rendered = self.ev.remote_call(
            "generate", self.role, list(prompts), config, batch_size
        )
        self.rendered.update(zip(prompts, rendered, strict=True))
        if kind == "partial":
            raise GenerationErrors(*value)
        return value

    def render_prompt(self, prompt: str) -> str:
        # The greedy stage records the rendered prompt right after its generate call.
        return self.rendered[prompt]

    def score(self, prompts, answers, **kwargs):  # type: ignore[no-untyped-def]
        raise NotImplementedError("the evaluation does not score given answers")


class _RemoteClusterer:
    def __init__(self, ev: RayEvaluator, described: dict[str, Any]) -> None:
        self.ev, self._info = ev, described.get("info") or {}

    def info(self) -> dict[str, Any]:
        return self._info

    def cluster_many(self, questions: list[str], answers: list[list[str]]) -> Any:
        return self.ev.remote_call("cluster_many", "clusterer", questions, answers)[1]


class RayEvaluator(Evaluator):
    """An :class:`~gnll.evaluation.run.runner.Evaluator` whose model work runs on Ray replicas.

    Parameters
    ----------
    config:
        The run, as for the local engine (the engine is not part of it: the same configuration
        gives the same run directory and fingerprints on either engine, so either can resume it).
    cluster:
        Where the replicas run and how many there are.
    """

    def __init__(self, config: Any, *, cluster: Cluster) -> None:
        super().__init__(config)
        self.cluster = cluster
        self._actors: list[Any] | None = None
        self._memo: dict[bytes, tuple[str, Any, Any]] = {}
        self._wanted: dict[bytes, tuple[Any, ...]] = {}

    # ------------------------------------------------------------------ components on replicas
    def _replicas(self) -> list[Any]:
        if self._actors is None:
            t = time.perf_counter()
            self._actors = start_replicas(
                EvalReplica, self.cluster, self.config, self.cluster.threads
            )
            self.timer.add("load_model", time.perf_counter() - t)
        return self._actors

    def _describe(self, role: str) -> dict[str, Any]:
        ray = require_ray()
        return ray.get(self._replicas()[0].describe.remote(role))

    def _load_model(self) -> Model:
        model = _Remote(self, "model", self._describe("model"))
        self._check_capabilities(model)
        return model

    @property
    def judge(self) -> Model:
        if self._judge is None:
            cfg = self.config
            same = cfg.judge == cfg.model and cfg.judge_args == cfg.model_args
            self._judge = self.model if same else _Remote(self, "judge", self._describe("judge"))
        self._note_component("judge", self._judge)
        return self._judge

    @property
    def clusterer(self) -> Any:
        if self._clusterer is None:
            self._clusterer = _RemoteClusterer(self, self._describe("clusterer"))
        self._note_component("clusterer", self._clusterer)
        return self._clusterer

    def generate(
        self, model: Model, prompts: list[str], config: GenerationConfig
    ) -> list[list[Generation]]:
        out = model.generate(prompts, config, batch_size=self.config.batch_size)
        if len(out) != len(prompts):
            raise RuntimeError(f"model returned {len(out)} outputs for {len(prompts)} prompts")
        return out

    # ------------------------------------------------------------------ rounds
    def remote_call(self, *call: Any) -> tuple[str, Any, Any]:
        """The result of ``call`` if a round computed it; otherwise record it and defer."""
        key = hashlib.sha256(pickle.dumps(call)).digest()
        if key in self._memo:
            kind, value, rendered = self._memo.pop(key)
            if kind == "raise":
                raise value
            return kind, value, rendered
        self._wanted[key] = call
        raise _Deferred

    def _compute(self) -> None:
        """Run the recorded calls on the replicas, as many at once as there are replicas."""
        require_ray()
        from ray.util import ActorPool

        calls = list(self._wanted.items())
        self._wanted = {}
        t = time.perf_counter()
        pool = ActorPool(self._replicas())
        results = pool.map(lambda a, c: a.call.remote(*c[1]), calls)
        for (key, _), res in zip(calls, results, strict=True):
            self._memo[key] = res
        self.timer.add("replicas", time.perf_counter() - t)

    def _run_split(
        self,
        stages: TaskStages,
        split: str,
        n: int,
        temperatures: Sequence[float],
        metrics: list[str],
        *,
        beams: bool,
        what: str | None = None,
    ) -> None:
        from tqdm.auto import tqdm

        examples = stages.run.data.split(split, n)
        cs = self.config.chunk_size
        pending = [
            Chunk(
                stages.run,
                split,
                k // cs,
                examples[k : k + cs],
                [(split, k + i) for i in range(len(examples[k : k + cs]))],
            )
            for k in range(0, len(examples), cs)
        ]
        steps = len(stages.plan(temperatures, metrics, beams=beams))
        bar = tqdm(
            total=len(pending) * steps,
            desc=f"{stages.run.name} [{what or split}] on {self.cluster.replicas} replica(s)",
            unit="step",
            disable=not progress_enabled(self.config.progress),
            dynamic_ncols=True,
        )
        try:
            while pending:
                waiting = []
                for chunk in pending:
                    try:
                        stages.run_chunk(chunk, temperatures, metrics, beams=beams)
                    except _Deferred:
                        waiting.append(chunk)
                if self._wanted:
                    bar.update(len(self._wanted))
                    self._compute()
                pending = waiting
        finally:
            bar.close()

    def run(self) -> dict[str, Any]:
        try:
            return super().run()
        finally:
            if self._actors is not None:
                ray = require_ray()
                for a in self._actors:
                    ray.kill(a)
                self._actors = None
