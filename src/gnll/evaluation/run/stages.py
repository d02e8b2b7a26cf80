"""The stages of a task: greedy answer, judge verdict, beams, samples and their semantic clusters.

Each stage is an object with a typed cache header (what produced its results; the cache file is
named by its hash) and two halves. :meth:`Stage.work` describes, on the driver, the computation of
the records of a chunk's questions that its cache does not hold yet: a picklable :class:`Work`
(prompts, generation configuration, which component) whose :meth:`Work.run` computes the records
wherever the components are (this process, or a Ray replica). :meth:`Stage.append` then appends
them to the cache on the driver, so an interrupted run recomputes nothing that reached the disk.
Which engine runs the work is the runner's chunk mapper, not the stage's concern. Stored
generations come back as :class:`~gnll.backends.base.Generation` objects.

Sampling is seeded per (task, split, temperature) and, in the backend, per (prompt, sample), so a
resumed run reproduces an uninterrupted one whatever was cut off and however it is re-chunked.
"""

from __future__ import annotations

import json
import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from gnll._util.seeds import derive_seed, stable_hash
from gnll.backends.base import Generation, GenerationConfig, GenerationErrors, Model
from gnll.backends.identity import outcome_args
from gnll.evaluation.data.datasets import Example
from gnll.evaluation.data.prompts import judge_prompt
from gnll.evaluation.results.correctness import judge_metric, judge_verdict
from gnll.evaluation.run.cache import JsonlCache
from gnll.evaluation.run.config import EvalConfig
from gnll.evaluation.run.store import TaskRun

if TYPE_CHECKING:
    from gnll.semantic import Clusterer

__all__ = [
    "JUDGE_CONFIG",
    "BeamStage",
    "Chunk",
    "ClusterStage",
    "ClusterWork",
    "Components",
    "GenerateWork",
    "GreedyStage",
    "JudgeStage",
    "PromptsFailed",
    "SampleStage",
    "Stage",
    "StageResult",
    "TaskStages",
    "Work",
]

JUDGE_CONFIG = GenerationConfig.greedy(max_new_tokens=8, stop=("\n",))

Key = tuple[str, int]
logger = logging.getLogger(__name__)


class Components(Protocol):
    """What a stage's work computes with (the :class:`~gnll.evaluation.run.runner.Evaluator`
    provides it, in the driver or in a replica; components are loaded on first use, so a run whose
    every stage is cached loads nothing)."""

    @property
    def model(self) -> Model: ...

    def judge_model(self, index: int) -> Model:
        """The ``index``-th judge of ``--judge A,B`` (0: the first)."""
        ...

    @property
    def clusterer(self) -> Clusterer: ...

    def clusterer_named(self, name: str) -> Clusterer:
        """The clusterer, ``auto`` resolved to ``name`` (the driver's choice, which the stage's
        cache header records), wherever the work runs."""
        ...

    def generate(
        self, model: Model, prompts: list[str], config: GenerationConfig
    ) -> list[list[Generation]]: ...


@dataclass
class StageResult:
    """The records a :class:`Work` computed, and what it computed them with."""

    records: list[dict[str, Any]]
    #: Questions that failed (position in the work -> message); they have no record.
    errors: dict[int, str]
    #: The component used (``model``, ``judge``, ``judge2``, ..., ``clusterer``) and its ``info()``.
    component: str
    info: dict[str, Any]


@dataclass(frozen=True)
class Work(ABC):
    """The computation of some questions' cache records: built on the driver, run anywhere."""

    #: Each question's record head (its key and id): ``{"k": [...], "id": ...}``.
    heads: list[dict[str, Any]]

    @abstractmethod
    def run(self, comps: Components) -> StageResult:
        """The records, computed with ``comps`` (one model or clusterer call)."""


@dataclass(frozen=True)
class GenerateWork(Work):
    """One ``generate`` call over the questions' prompts; each record holds the generations."""

    prompts: list[str]
    config: GenerationConfig
    #: ``None``: the evaluated model; ``i``: the ``i``-th judge.
    judge: int | None = None

    def run(self, comps: Components) -> StageResult:
        model = comps.model if self.judge is None else comps.judge_model(self.judge)
        errors: dict[int, str] = {}
        try:
            gens: list[list[Generation] | None] = list(
                comps.generate(model, self.prompts, self.config)
            )
        except GenerationErrors as exc:
            gens, errors = list(exc.results), dict(exc.errors)
        records = [
            {**head, **self.data(model, prompt, g)}
            for head, prompt, g in zip(self.heads, self.prompts, gens, strict=True)
            if g is not None
        ]
        kind = "model" if self.judge is None else judge_metric(self.judge)
        return StageResult(records, errors, kind, model.info())

    def data(self, model: Model, prompt: str, gens: list[Generation]) -> dict[str, Any]:
        """What a question's record holds besides its head."""
        return {"gens": [g.to_dict() for g in gens]}


@dataclass(frozen=True)
class GreedyWork(GenerateWork):
    """The greedy answer and the prompt exactly as the model saw it."""

    def data(self, model: Model, prompt: str, gens: list[Generation]) -> dict[str, Any]:
        return {"prompt": model.render_prompt(prompt), "gen": gens[0].to_dict()}


@dataclass(frozen=True)
class JudgeWork(GenerateWork):
    """The judge's reply and the verdict read from it."""

    def data(self, model: Model, prompt: str, gens: list[Generation]) -> dict[str, Any]:
        return {"reply": gens[0].text, "verdict": judge_verdict(gens[0].text).detail}


@dataclass(frozen=True)
class ClusterWork(Work):
    """One ``cluster_many`` call over the questions' sampled answers."""

    questions: list[str]
    answers: list[list[str]]
    #: The clusterer's name as the driver resolved it (``auto``: the one it picked): a replica
    #: clusters with the same one, so records and the cache header cannot disagree.
    clusterer: str

    def run(self, comps: Components) -> StageResult:
        clusterer = comps.clusterer_named(self.clusterer)
        ids = clusterer.cluster_many(self.questions, self.answers)
        records = [
            {**head, "cluster_ids": [int(c) for c in cid]}
            for head, cid in zip(self.heads, ids, strict=True)
        ]
        return StageResult(records, {}, "clusterer", clusterer.info())


def load_run_clusterer(cfg: EvalConfig, resolved: str) -> Clusterer:
    """The run's clusterer: ``cfg.clusterer``, or for ``auto`` the ``resolved`` name (what the
    cache header records); ``--semantic_relation`` is dropped with a warning when ``auto`` chose a
    clusterer without one."""
    from gnll.semantic import AUTO_NAMES, load_clusterer, takes_option

    name, relation = cfg.clusterer, cfg.semantic_relation
    if name in AUTO_NAMES:
        name = resolved
        if relation is not None and not takes_option(name, "relation"):
            logger.warning(
                "--semantic_relation %s ignored: 'auto' chose the %s clusterer, which has "
                "no entailment relation (pass --clusterer nli or llm to use it)",
                relation,
                name,
            )
            relation = None
    return load_clusterer(name, relation=relation, **cfg.clusterer_args)


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
    """One cached step of the pipeline: :meth:`work` (driver) -> :meth:`Work.run` (anywhere) ->
    :meth:`append` (driver)."""

    #: Timer and progress label.
    label: str

    def __init__(self, run: TaskRun, file: str, header: dict[str, Any]):
        self.run, self.header = run, header
        self.cache: JsonlCache = run.cache(file, header)

    def todo(self, chunk: Chunk) -> list[int]:
        """The questions of ``chunk`` (indices) its cache does not hold yet."""
        return [i for i, k in enumerate(chunk.keys) if not self.cache.has(k)]

    def batch(self, chunk: Chunk, todo: list[int]) -> list[int]:
        """The questions to compute for ``todo``. A chunk partly on disk because a kill tore its
        append is computed whole again, in one call as the uninterrupted run did, so that even
        batch-dependent float rounding is the same (only the missing records are appended: the
        resumed run is byte-identical). A chunk partly on disk from whole appends (an earlier run
        with a smaller ``--limit``, or another ``--chunk_size``) keeps them: only its missing
        questions are computed."""
        torn = len(todo) < len(chunk.keys) and self.cache.may_be_torn(chunk.keys)
        return list(range(len(chunk.keys))) if torn else todo

    @abstractmethod
    def work(self, chunk: Chunk, batch: list[int]) -> Work:
        """The computation of the records of questions ``batch`` (indices into ``chunk``)."""

    def append(self, chunk: Chunk, todo: list[int], batch: list[int], result: StageResult) -> None:
        """Append ``result``'s records of the questions ``todo``; failures (absent from the
        records) are listed in ``failures.jsonl`` and raised as :class:`PromptsFailed` after the
        others are saved."""
        missing = {tuple(chunk.keys[i]) for i in todo}
        self.cache.append([r for r in result.records if (r["k"][0], int(r["k"][1])) in missing])
        failed = {batch[j]: msg for j, msg in result.errors.items() if batch[j] in set(todo)}
        if failed:
            raise self._report_failures(chunk, failed)

    def check(self, chunk: Chunk) -> None:
        """Check the chunk's stored records against the data (after it is filled)."""
        return None  # most stages store nothing to check against the data

    def _report_failures(self, chunk: Chunk, failed: dict[int, str]) -> PromptsFailed:
        path = self.cache.path.parent / "failures.jsonl"
        with path.open("a", encoding="utf-8") as fh:
            for i, msg in sorted(failed.items()):
                fh.write(json.dumps({**chunk.record(i, stage=self.label), "error": msg}) + "\n")
        first = min(failed)
        return PromptsFailed(
            f"{len(failed)} question(s) failed at the {self.label} stage of "
            f"{self.run.name} (first: id {chunk.examples[first].id}: {failed[first]}); "
            f"the others are saved, the failures listed in {path}: fix the cause and rerun "
            "with --resume to retry them"
        )

    def generations(self, key: Key) -> list[Generation]:
        """The stored generations of question ``key``."""
        return [Generation.from_dict(g) for g in self.cache.get(key)["gens"]]


def _heads(chunk: Chunk, batch: list[int]) -> list[dict[str, Any]]:
    return [chunk.record(i) for i in batch]


class GreedyStage(Stage):
    """The greedy answer: the reference answer whose correctness is judged, and G-NLL's input."""

    label = "greedy"

    def __init__(self, run: TaskRun):
        self.config = GenerationConfig.greedy(
            max_new_tokens=run.data.task.max_new_tokens, seed=None
        )
        header = {
            "fingerprint": run.cache_key,
            "stage": "greedy",
            "generation": self.config.to_dict(),
        }
        super().__init__(run, "greedy", header)

    def work(self, chunk: Chunk, batch: list[int]) -> Work:
        prompts = [chunk.prompts[i] for i in batch]
        return GreedyWork(_heads(chunk, batch), prompts, self.config)

    def check(self, chunk: Chunk) -> None:
        for ex, r in zip(chunk.examples, self.cache.get_many(chunk.keys), strict=True):
            if r["id"] != ex.id:
                raise RuntimeError(
                    f"cache {self.cache.path} is out of step with the data (id {r['id']})"
                )

    def answer(self, key: Key) -> Generation:
        return Generation.from_dict(self.cache.get(key)["gen"])

    def rendered_prompt(self, key: Key) -> str:
        """The prompt exactly as the model saw it (chat template applied)."""
        return self.cache.get(key)["prompt"]


class JudgeStage(Stage):
    """The judge model's verdict on each greedy answer (f1 and contains are computed on assembly)."""

    label = "judge"

    def __init__(self, run: TaskRun, greedy: Any, cfg: EvalConfig, index: int = 0):
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
        super().__init__(run, self.metric, header)

    def work(self, chunk: Chunk, batch: list[int]) -> Work:
        task = self.run.data.task
        prompts = [
            judge_prompt(
                task.judge_question(chunk.examples[i]),
                chunk.examples[i].answers,
                self.greedy.answer(chunk.keys[i]).text,
            )
            for i in batch
        ]
        return JudgeWork(_heads(chunk, batch), prompts, JUDGE_CONFIG, judge=self.index)

    def reply(self, key: Key) -> str:
        return self.cache.get(key)["reply"]


class BeamStage(Stage):
    """K beam-search outputs (BS-MSP)."""

    label = "beams"

    def __init__(self, run: TaskRun, beams: int):
        self.config = GenerationConfig.beam(
            beams, max_new_tokens=run.data.task.max_new_tokens, seed=None
        )
        header = {
            "fingerprint": run.cache_key,
            "stage": "beams",
            "generation": self.config.to_dict(),
        }
        super().__init__(run, "beams", header)

    def work(self, chunk: Chunk, batch: list[int]) -> Work:
        return GenerateWork(_heads(chunk, batch), [chunk.prompts[i] for i in batch], self.config)


class SampleStage(Stage):
    """N sampled answers at one temperature (PE, SE, ... and their clusters)."""

    def __init__(self, run: TaskRun, cfg: EvalConfig, temperature: float):
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
        super().__init__(run, f"samples-t{temperature:g}", header)

    def work(self, chunk: Chunk, batch: list[int]) -> Work:
        # Not the chunk: the backend seeds each (prompt, sample) from its identity, so a torn
        # chunk, another --chunk_size or another batch size on resume draws the same samples.
        seed = derive_seed(self.seed, self.run.name, chunk.split, self.temperature)
        config = self.config.replace(seed=seed)
        return GenerateWork(_heads(chunk, batch), [chunk.prompts[i] for i in batch], config)


class ClusterStage(Stage):
    """Semantic cluster ids of one temperature's samples."""

    label = "clusters"

    def __init__(
        self,
        run: TaskRun,
        samples: SampleStage,
        cfg: EvalConfig,
        clusterer_name: str,
    ):
        self.samples = samples
        self.clusterer_name = clusterer_name
        header = {
            "stage": "clusters",
            "samples": stable_hash(samples.header),
            "clusterer": clusterer_name,
            "clusterer_args": outcome_args(cfg.clusterer_args),
            "relation": cfg.semantic_relation,
        }
        super().__init__(run, f"clusters-t{samples.temperature:g}", header)

    def work(self, chunk: Chunk, batch: list[int]) -> Work:
        task = self.run.data.task
        questions = [task.judge_question(chunk.examples[i]) for i in batch]
        answers = [[g.text for g in self.samples.generations(chunk.keys[i])] for i in batch]
        return ClusterWork(_heads(chunk, batch), questions, answers, self.clusterer_name)

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

    def __init__(self, run: TaskRun, cfg: EvalConfig, clusterer_name: str) -> None:
        self.run, self.cfg, self.clusterer_name = run, cfg, clusterer_name
        self.greedy = GreedyStage(run)
        self.beams = BeamStage(run, cfg.beams) if cfg.needs_beams else None
        self.reference: Any = self.greedy if cfg.reference == "greedy" else TopBeam(self.beams)
        #: one stage per judge of ``--judge A,B``, by correctness metric (``judge``, ``judge2``, ...)
        self.judges = {
            m: JudgeStage(run, self.reference, cfg, i) for i, m in enumerate(cfg.judge_metrics)
        }
        self._samples: dict[float, SampleStage] = {}
        self._clusters: dict[float, ClusterStage] = {}

    def samples(self, temperature: float) -> SampleStage:
        if temperature not in self._samples:
            self._samples[temperature] = SampleStage(self.run, self.cfg, temperature)
        return self._samples[temperature]

    def clusters(self, temperature: float) -> ClusterStage | None:
        """The clustering of ``temperature``'s samples (``None`` when no measure needs it)."""
        if not self.cfg.needs_clusters:
            return None
        if temperature not in self._clusters:
            self._clusters[temperature] = ClusterStage(
                self.run, self.samples(temperature), self.cfg, self.clusterer_name
            )
        return self._clusters[temperature]

    def steps(
        self, temperatures: Sequence[float], metrics: Sequence[str], *, beams: bool
    ) -> list[tuple[str, Stage]]:
        """The stages a chunk needs, in pipeline order, each with its progress label."""
        steps: list[tuple[str, Stage]] = [("greedy", self.greedy)]
        reference_beams = self.cfg.reference == "beam" and self.beams is not None
        if reference_beams:
            steps.append(("beams", self.beams))  # the reference answer, before it is judged
        steps += [(st.label, st) for m, st in self.judges.items() if m in metrics]
        if beams and self.beams is not None and not reference_beams:
            steps.append(("beams", self.beams))
        for temp in temperatures:
            steps.append((f"samples T={temp:g}", self.samples(temp)))
            clusters = self.clusters(temp)
            if clusters is not None:
                steps.append((f"clusters T={temp:g}", clusters))
        return steps
