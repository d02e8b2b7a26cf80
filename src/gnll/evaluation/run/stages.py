"""The stages of a task: greedy answer, judge verdict, beams, samples and their semantic clusters.

Each stage is an object with a typed cache header (what produced its results; the cache file is
named by its hash) and a ``compute`` method that produces the records of the questions of a chunk
that its cache does not hold yet. :meth:`Stage.fill` runs it and appends the new records, so an
interrupted run recomputes nothing that reached the disk. Stored generations come back as
:class:`~gnll.backends.base.Generation` objects.

Sampling is seeded per (task, split, temperature) and, in the backend, per (prompt, sample), so a
resumed run reproduces an uninterrupted one whatever was cut off and however it is re-chunked.
"""

from __future__ import annotations

import json
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from gnll._util.seeds import derive_seed, stable_hash
from gnll.backends.base import Generation, GenerationConfig, GenerationErrors, Model
from gnll.backends.identity import outcome_args
from gnll.evaluation.data.datasets import Example
from gnll.evaluation.data.prompts import judge_prompt
from gnll.evaluation.results.correctness import judge_metric, judge_verdict
from gnll.evaluation.run.cache import JsonlCache
from gnll.evaluation.run.config import EvalConfig
from gnll.evaluation.run.store import TaskRun

__all__ = [
    "JUDGE_CONFIG",
    "BeamStage",
    "PromptsFailed",
    "Chunk",
    "ClusterStage",
    "Components",
    "GreedyStage",
    "JudgeStage",
    "SampleStage",
    "Stage",
    "TaskStages",
]

JUDGE_CONFIG = GenerationConfig.greedy(max_new_tokens=8, stop=("\n",))

Key = tuple[str, int]


class Components(Protocol):
    """What stages compute with (the :class:`~gnll.evaluation.run.runner.Evaluator` provides it;
    components are loaded on first use, so a run whose every stage is cached loads nothing)."""

    @property
    def model(self) -> Model: ...

    def judge_model(self, index: int) -> Model:
        """The ``index``-th judge of ``--judge A,B`` (0: the first)."""
        ...

    @property
    def clusterer(self) -> Any: ...

    def generate(
        self, model: Model, prompts: list[str], config: GenerationConfig
    ) -> list[list[Generation]]: ...

    def timed(self, label: str, seconds: float) -> None: ...


@dataclass
class Chunk:
    """Consecutive questions of one split, computed together (one generate call per stage)."""

    run: TaskRun
    split: str
    number: int
    examples: list[Example]
    keys: list[Key]
    _prompts: list[str] | None = field(default=None, repr=False)

    @property
    def prompts(self) -> list[str]:
        """The user prompts (built on first use: a fully cached chunk never builds them)."""
        if self._prompts is None:
            self._prompts = [self.run.data.prompt(ex) for ex in self.examples]
        return self._prompts

    def record(self, i: int, **data: Any) -> dict[str, Any]:
        """A cache record of question ``i``: its key, its id and ``data``."""
        return {"k": list(self.keys[i]), "id": self.examples[i].id, **data}


class PromptsFailed(ValueError):
    """Some questions of a stage failed (e.g. a server rejected their prompts); the others were kept.

    A ``ValueError``: the cause is in the input or the server's configuration, not in gnll. The
    failed questions are listed in ``failures.jsonl`` next to the stage's cache and are not in
    the cache, so ``--resume`` computes them again.
    """


class Stage(ABC):
    """One cached step of the pipeline."""

    #: Timer and progress label.
    label: str

    def __init__(self, run: TaskRun, comps: Components, file: str, header: dict[str, Any]):
        self.run, self.comps, self.header = run, comps, header
        self.cache: JsonlCache = run.cache(file, header)

    @abstractmethod
    def compute(self, chunk: Chunk, todo: list[int]) -> list[dict[str, Any]]:
        """Cache records of the questions ``todo`` (indices into ``chunk``)."""

    def fill(self, chunk: Chunk) -> list[dict[str, Any]]:
        """Records of every question of ``chunk``; missing ones are computed and appended."""
        todo = [i for i, k in enumerate(chunk.keys) if not self.cache.has(k)]
        if todo:
            t = time.perf_counter()
            self._failed: dict[int, str] = {}
            # A chunk partly on disk because a kill tore its append: recompute all of it, in one
            # call as the uninterrupted run did, so that even batch-dependent float rounding is
            # the same, and append only the missing records: the resumed run is byte-identical.
            # A chunk partly on disk from whole appends (an earlier run with a smaller --limit,
            # or another --chunk_size) keeps them: only its missing questions are computed.
            # (Questions that failed are simply absent from the records; see _generate.)
            torn = len(todo) < len(chunk.keys) and self.cache.may_be_torn(chunk.keys)
            batch = list(range(len(chunk.keys))) if torn else todo
            missing = {tuple(chunk.keys[i]) for i in todo}
            records = self.compute(chunk, batch)
            self.cache.append([r for r in records if (r["k"][0], int(r["k"][1])) in missing])
            self._failed = {i: msg for i, msg in self._failed.items() if i in set(todo)}
            self.comps.timed(self.label, time.perf_counter() - t)
            if self._failed:
                self._report_failures(chunk)
        return self.cache.get_many(chunk.keys)

    def _generate(
        self, model: Model, todo: list[int], prompts: list[str], config: GenerationConfig
    ) -> list[tuple[int, list[Generation]]]:
        """``(question, generations)`` of the prompts that did not fail; failures are noted."""
        try:
            gens: list[list[Generation] | None] = list(self.comps.generate(model, prompts, config))
        except GenerationErrors as exc:
            gens = exc.results
            self._failed.update({todo[j]: msg for j, msg in exc.errors.items()})
        return [(i, g) for i, g in zip(todo, gens, strict=True) if g is not None]

    def _report_failures(self, chunk: Chunk) -> None:
        path = self.cache.path.parent / "failures.jsonl"
        with path.open("a", encoding="utf-8") as fh:
            for i, msg in sorted(self._failed.items()):
                fh.write(json.dumps({**chunk.record(i, stage=self.label), "error": msg}) + "\n")
        first = min(self._failed)
        raise PromptsFailed(
            f"{len(self._failed)} question(s) failed at the {self.label} stage of "
            f"{self.run.name} (first: id {chunk.examples[first].id}: {self._failed[first]}); "
            f"the others are saved, the failures listed in {path}: fix the cause and rerun "
            "with --resume to retry them"
        )

    def _generate_all(
        self, chunk: Chunk, todo: list[int], config: GenerationConfig
    ) -> list[dict[str, Any]]:
        done = self._generate(self.comps.model, todo, [chunk.prompts[i] for i in todo], config)
        return [chunk.record(i, gens=[g.to_dict() for g in gs]) for i, gs in done]

    def generations(self, key: Key) -> list[Generation]:
        """The stored generations of question ``key``."""
        return [Generation.from_dict(g) for g in self.cache.get(key)["gens"]]


class GreedyStage(Stage):
    """The greedy answer: the reference answer whose correctness is judged, and G-NLL's input."""

    label = "greedy"

    def __init__(self, run: TaskRun, comps: Components):
        self.config = GenerationConfig.greedy(
            max_new_tokens=run.data.task.max_new_tokens, seed=None
        )
        header = {
            "fingerprint": run.cache_key,
            "stage": "greedy",
            "generation": self.config.to_dict(),
        }
        super().__init__(run, comps, "greedy", header)

    def compute(self, chunk: Chunk, todo: list[int]) -> list[dict[str, Any]]:
        model = self.comps.model
        done = self._generate(model, todo, [chunk.prompts[i] for i in todo], self.config)
        return [
            chunk.record(i, prompt=model.render_prompt(chunk.prompts[i]), gen=g[0].to_dict())
            for i, g in done
        ]

    def fill(self, chunk: Chunk) -> list[dict[str, Any]]:
        records = super().fill(chunk)
        for ex, r in zip(chunk.examples, records, strict=True):
            if r["id"] != ex.id:
                raise RuntimeError(
                    f"cache {self.cache.path} is out of step with the data (id {r['id']})"
                )
        return records

    def answer(self, key: Key) -> Generation:
        return Generation.from_dict(self.cache.get(key)["gen"])

    def rendered_prompt(self, key: Key) -> str:
        """The prompt exactly as the model saw it (chat template applied)."""
        return self.cache.get(key)["prompt"]


class JudgeStage(Stage):
    """The judge model's verdict on each greedy answer (f1 and contains are computed on assembly)."""

    label = "judge"

    def __init__(
        self, run: TaskRun, comps: Components, greedy: Any, cfg: EvalConfig, index: int = 0
    ):
        # ``greedy``: the stage whose ``answer(key)`` is judged (the top beam for --reference beam)
        self.greedy, self.index = greedy, index
        self.metric = judge_metric(index)
        self.name = cfg.judges[index]
        if index:
            self.label = f"judge #{index + 1}"
        header = {
            "fingerprint": run.cache_key,
            "stage": "judge",
            "greedy": stable_hash(greedy.header),
            "judge": self.name,
            "judge_args": outcome_args(cfg.judge_args_for(index)),
            "generation": JUDGE_CONFIG.to_dict(),
            # the judge prompt's wording (a change invalidates the judgements)
            "prompt": stable_hash(
                judge_prompt("Q?", ["A", "B"], "P") + judge_prompt("Q?", ["A"], "P")
            ),
        }
        super().__init__(run, comps, self.metric, header)

    def compute(self, chunk: Chunk, todo: list[int]) -> list[dict[str, Any]]:
        task = self.run.data.task
        prompts = [
            judge_prompt(
                task.judge_question(chunk.examples[i]),
                chunk.examples[i].answers,
                self.greedy.answer(chunk.keys[i]).text,
            )
            for i in todo
        ]
        replies = self._generate(self.comps.judge_model(self.index), todo, prompts, JUDGE_CONFIG)
        return [
            chunk.record(i, reply=r[0].text, verdict=judge_verdict(r[0].text).detail)
            for i, r in replies
        ]

    def reply(self, key: Key) -> str:
        return self.cache.get(key)["reply"]


class BeamStage(Stage):
    """K beam-search outputs (BS-MSP)."""

    label = "beams"

    def __init__(self, run: TaskRun, comps: Components, beams: int):
        self.config = GenerationConfig.beam(
            beams, max_new_tokens=run.data.task.max_new_tokens, seed=None
        )
        header = {
            "fingerprint": run.cache_key,
            "stage": "beams",
            "generation": self.config.to_dict(),
        }
        super().__init__(run, comps, "beams", header)

    def compute(self, chunk: Chunk, todo: list[int]) -> list[dict[str, Any]]:
        return self._generate_all(chunk, todo, self.config)


class SampleStage(Stage):
    """N sampled answers at one temperature (PE, SE, ... and their clusters)."""

    def __init__(self, run: TaskRun, comps: Components, cfg: EvalConfig, temperature: float):
        self.temperature, self.seed = temperature, cfg.seed
        self.label = f"samples_t{temperature:g}"
        self.config = GenerationConfig.sample(
            cfg.samples,
            temperature=temperature,
            max_new_tokens=run.data.task.max_new_tokens,
            seed=cfg.seed,
        )
        header = {
            "fingerprint": run.cache_key,
            "stage": "samples",
            "generation": self.config.to_dict(),
        }
        super().__init__(run, comps, f"samples-t{temperature:g}", header)

    def compute(self, chunk: Chunk, todo: list[int]) -> list[dict[str, Any]]:
        # Not the chunk: the backend seeds each (prompt, sample) from its identity, so a torn
        # chunk, another --chunk_size or another batch size on resume draws the same samples.
        seed = derive_seed(self.seed, self.run.name, chunk.split, self.temperature)
        return self._generate_all(chunk, todo, self.config.replace(seed=seed))


class ClusterStage(Stage):
    """Semantic cluster ids of one temperature's samples."""

    label = "clusters"

    def __init__(
        self,
        run: TaskRun,
        comps: Components,
        samples: SampleStage,
        cfg: EvalConfig,
        clusterer_name: str,
    ):
        self.samples = samples
        header = {
            "stage": "clusters",
            "samples": stable_hash(samples.header),
            "clusterer": clusterer_name,
            "clusterer_args": outcome_args(cfg.clusterer_args),
            "relation": cfg.semantic_relation,
        }
        super().__init__(run, comps, f"clusters-t{samples.temperature:g}", header)

    def compute(self, chunk: Chunk, todo: list[int]) -> list[dict[str, Any]]:
        task = self.run.data.task
        questions = [task.judge_question(chunk.examples[i]) for i in todo]
        answers = [[g.text for g in self.samples.generations(chunk.keys[i])] for i in todo]
        ids = self.comps.clusterer.cluster_many(questions, answers)
        return [
            chunk.record(i, cluster_ids=[int(c) for c in cid])
            for i, cid in zip(todo, ids, strict=True)
        ]

    def cluster_ids(self, key: Key) -> list[int]:
        return list(self.cache.get(key)["cluster_ids"])


class TopBeam:
    """The most likely of the K beams as the reference answer (the paper's Table 5)."""

    def __init__(self, beams: BeamStage) -> None:
        self.beams = beams
        self.header = {**beams.header, "reference": "top beam"}

    def answer(self, key: Key) -> Generation:
        # Ranked here, not trusted from the cache's order: the beams are ranked by the empty-answer
        # rule (:attr:`Generation.logprob`), ties to the first, as ``rescore_beams`` sorts them.
        return max(self.beams.generations(key), key=lambda g: g.logprob)


class TaskStages:
    """Every stage of one task, built once: which ones exist follows from the configuration."""

    def __init__(
        self, run: TaskRun, comps: Components, cfg: EvalConfig, clusterer_name: str
    ) -> None:
        self.run, self.comps, self.cfg, self.clusterer_name = run, comps, cfg, clusterer_name
        self.greedy = GreedyStage(run, comps)
        self.beams = BeamStage(run, comps, cfg.beams) if cfg.needs_beams else None
        self.reference: Any = self.greedy if cfg.reference == "greedy" else TopBeam(self.beams)
        #: one stage per judge of ``--judge A,B``, by correctness metric (``judge``, ``judge2``, ...)
        self.judges = {
            m: JudgeStage(run, comps, self.reference, cfg, i)
            for i, m in enumerate(cfg.judge_metrics)
        }
        self._samples: dict[float, SampleStage] = {}
        self._clusters: dict[float, ClusterStage] = {}

    def samples(self, temperature: float) -> SampleStage:
        if temperature not in self._samples:
            self._samples[temperature] = SampleStage(self.run, self.comps, self.cfg, temperature)
        return self._samples[temperature]

    def clusters(self, temperature: float) -> ClusterStage | None:
        """The clustering of ``temperature``'s samples (``None`` when no measure needs it)."""
        if not self.cfg.needs_clusters:
            return None
        if temperature not in self._clusters:
            self._clusters[temperature] = ClusterStage(
                self.run, self.comps, self.samples(temperature), self.cfg, self.clusterer_name
            )
        return self._clusters[temperature]

    def plan(
        self, temperatures: Sequence[float], metrics: Sequence[str], *, beams: bool
    ) -> list[str]:
        """The labels :meth:`run_chunk` will report, in order (for progress shares)."""
        labels = ["greedy"]
        labels += [st.label for m, st in self.judges.items() if m in metrics]
        if beams and self.beams is not None:
            labels.append("beams")
        for temp in temperatures:
            labels.append(f"samples T={temp:g}")
            if self.cfg.needs_clusters:
                labels.append(f"clusters T={temp:g}")
        return labels

    def run_chunk(
        self,
        chunk: Chunk,
        temperatures: Sequence[float],
        metrics: Sequence[str],
        *,
        beams: bool,
        status: Callable[[str], None] = lambda label: None,
    ) -> None:
        """Fill every stage this chunk needs, in pipeline order."""
        status("greedy")
        self.greedy.fill(chunk)
        if self.cfg.reference == "beam" and self.beams is not None:
            status("beams")  # the reference answer, before it is judged
            self.beams.fill(chunk)
        for metric, judge in self.judges.items():
            if metric in metrics:
                status(judge.label)
                judge.fill(chunk)
        if beams and self.beams is not None:
            status("beams")
            self.beams.fill(chunk)
        for temp in temperatures:
            status(f"samples T={temp:g}")
            self.samples(temp).fill(chunk)
            clusters = self.clusters(temp)
            if clusters is not None:
                status(f"clusters T={temp:g}")
                clusters.fill(chunk)
