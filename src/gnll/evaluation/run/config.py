"""What defines an evaluation run: :class:`EvalConfig` (``gnll eval`` maps one-to-one onto it).

Example
-------
>>> cfg = EvalConfig(model="smollm2-135m-instruct", tasks=["svamp_short"], output_path="runs/x",
...                  measures=["g-nll"], limit=20)
>>> cfg.needs_samples, cfg.needs_beams
(False, False)
"""

from __future__ import annotations

import logging
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gnll import measures as M
from gnll._util.validation import ParameterError
from gnll.backends.identity import redact
from gnll.evaluation.data.datasets import resolve_source
from gnll.evaluation.data.tasks import Task, get_task
from gnll.evaluation.results.correctness import (
    CORRECTNESS_METRICS,
    F1_RULES,
    judge_index,
    judge_metric,
)

logger = logging.getLogger(__name__)

__all__ = ["TEMPERATURES", "EvalConfig"]

#: Candidate sampling temperatures (the held-out pool picks one).
TEMPERATURES = (0.5, 1.0, 1.5)


@dataclass
class EvalConfig:
    """Everything that defines an evaluation run (the CLI maps one-to-one onto it)."""

    model: str
    tasks: list[str]
    output_path: str | Path
    model_args: dict[str, Any] = field(default_factory=dict)
    limit: int | None = None
    data_dir: str | None = None
    data_path: str | None = None
    # "auto": the full files when data_dir/data_path/$GNLL_DATA_DIR give them, else the embedded
    # sample (resolved at construction, so a run records where its questions came from)
    data_source: str = "auto"
    split_path: str | None = None  # ids of the evaluation pool (e.g. a test split), one per line
    pool_path: str | None = None  # a file the few-shot and held-out pools come from instead
    correctness: list[str] | None = None
    judge: str | None = None
    # one loader-argument set for every judge, or one per judge of ``judge`` (a list)
    judge_args: dict[str, Any] | list[dict[str, Any]] = field(default_factory=dict)
    beams: int = 5
    samples: int = 10
    temperature: float | None = None
    temperatures: tuple[float, ...] = TEMPERATURES
    measures: list[str] = field(default_factory=lambda: list(M.ORDER))
    batch_size: int | None = None
    chunk_size: int = 256
    seed: int = 0
    resume: bool = False
    overwrite: bool = False  # delete an earlier run in output_path and start over
    clusterer: str = "auto"
    clusterer_args: dict[str, Any] = field(default_factory=dict)
    semantic_relation: str | None = None
    heldout_size: int | None = None  # None: min(100, limit)
    fewshot_as_multiturn: bool = False  # chat models: few-shot examples as chat turns
    n_boot: int = 1000
    f1_rule: str = "gt"  # the paper's "F1 exceeds 0.5"; "ge" is the reference code's >= 0.5
    # each sampling measure its own held-out temperature ("their optimal hyperparameter settings")
    temperature_selection: str = "per-measure"
    # what one choice covers: "task", or "dataset" (App. D tunes "for each dataset": the short and
    # long tasks of a dataset share the choice, made on their pooled held-out AUROCs)
    temperature_scope: str = "task"
    # log-probs of sampled answers: "model" (temperature 1) or "sampling" (the distribution they were
    # drawn from, as the reference code scores them)
    sample_logprobs: str = "model"
    # an empty answer's likelihood: "terminator" (its stop token, as the reference code) or "zero"
    empty_answer: str = "terminator"
    # the answer whose correctness is judged and whose NLL is G-NLL: the greedy answer (Table 1) or
    # the most likely of the K beams (the paper's Table 5)
    reference: str = "greedy"
    plots: bool = True
    progress: bool = True

    def __post_init__(self) -> None:
        self.output_path = Path(self.output_path)
        self.data_source = resolve_source(self.data_source, self.data_dir, self.data_path)
        self.tasks = [get_task(t).name for t in self.tasks]
        self.measures = M.validate(self.measures, paper_order=True)
        if self.judge is not None and not all(self.judges):
            raise ParameterError("judge", f"{self.judge!r}: an empty judge name in the list")
        if isinstance(self.judge_args, list | tuple) and len(self.judge_args) != len(self.judges):
            raise ParameterError(
                "judge_args",
                f"gives {len(self.judge_args)} ';'-separated sets for {len(self.judges)} "
                "judge(s): give one set for all or one per judge",
            )
        if self.correctness is not None:
            bad = [
                c
                for c in self.correctness
                if c not in CORRECTNESS_METRICS
                and (judge_index(c) is None or judge_index(c) >= len(self.judges))
            ]
            if bad:
                known = (*CORRECTNESS_METRICS, *self.judge_metrics[1:])
                raise ParameterError(
                    "correctness", f"has unknown correctness metric(s) {bad}; choose from {known}"
                )
            if "judge" in self.correctness and not self.judge:
                raise ParameterError(
                    "judge", "is needed by correctness metric 'judge' (the model that judges)"
                )
        for name in ("beams", "samples"):
            if getattr(self, name) < 0:
                raise ParameterError(name, f"must be >= 0, got {getattr(self, name)}")
        if self.samples == 1 and self.needs_samples:
            logger.warning(
                "--samples 1: sampling-based measures from a single sample are degenerate"
            )
        if self.temperature is not None and not (
            self.temperature > 0 and math.isfinite(self.temperature)
        ):
            raise ParameterError("temperature", f"must be positive, got {self.temperature}")
        if self.limit is not None and self.limit < 1:
            raise ParameterError("limit", f"must be >= 1, got {self.limit}")
        if self.chunk_size < 1:
            raise ParameterError("chunk_size", f"must be >= 1, got {self.chunk_size}")
        for name, allowed in (
            ("temperature_selection", ("per-measure", "shared")),
            ("temperature_scope", ("task", "dataset")),
            ("sample_logprobs", ("model", "sampling")),
            ("empty_answer", ("terminator", "zero")),
            ("reference", ("greedy", "beam")),
        ):
            value = getattr(self, name)
            if value not in allowed:
                raise ParameterError(name, f"must be one of {allowed}, got {value!r}")
        if self.reference == "beam" and self.beams < 1:
            raise ParameterError("reference", "beam needs beams K >= 1", others=("beams",))
        if self.f1_rule not in F1_RULES:
            raise ParameterError("f1_rule", f"must be one of {F1_RULES}, got {self.f1_rule!r}")

    @property
    def needs_beams(self) -> bool:
        if self.reference == "beam":
            return True  # the reference answer is the top beam
        return self.beams > 0 and M.Needs.BEAMS in M.requirements(self.measures)

    @property
    def needs_samples(self) -> bool:
        return self.samples > 0 and M.Needs.SAMPLES in M.requirements(self.measures)

    @property
    def needs_clusters(self) -> bool:
        return self.needs_samples and M.Needs.CLUSTERS in M.requirements(self.measures)

    @property
    def generated(self) -> M.Needs:
        """The evidence this run generates (``--beams 0`` / ``--samples 0`` switch parts off)."""
        have = M.Needs.GREEDY | M.Needs.TERMINATOR  # every greedy answer records its terminator
        if self.needs_beams:
            have |= M.Needs.BEAMS
        if self.needs_samples:
            have |= M.Needs.SAMPLES
        if self.needs_clusters:
            have |= M.Needs.CLUSTERS
        return have

    @property
    def active_measures(self) -> list[str]:
        """The selected measures that the generated evidence allows (paper order)."""
        return M.computable(self.measures, self.generated)

    @property
    def judges(self) -> list[str]:
        """The judge models (``--judge A,B``: several, each with its own correctness rows)."""
        return [j.strip() for j in self.judge.split(",")] if self.judge else []

    def judge_args_for(self, index: int) -> dict[str, Any]:
        """The loader arguments of the ``index``-th judge."""
        if isinstance(self.judge_args, list | tuple):
            return dict(self.judge_args[index])
        return dict(self.judge_args)

    @property
    def judge_metrics(self) -> list[str]:
        """The correctness metric of each judge: ``judge``, ``judge2``, ..."""
        return [judge_metric(i) for i in range(len(self.judges))]

    def correctness_for(self, task: Task) -> list[str]:
        """Correctness metrics of ``task``; the first is the primary one (temperature selection)."""
        if self.correctness is not None:
            return list(dict.fromkeys(self.correctness))
        if self.judge:
            judged = self.judge_metrics
            return ["f1", *judged] if task.mode == "short" else [*judged, "contains"]
        return list(task.default_correctness)

    def public(self) -> dict[str, Any]:
        """The configuration as recorded in results (run mechanics such as paths are left out)."""
        d = asdict(self)
        for k in ("output_path", "resume", "overwrite", "progress", "plots"):
            d.pop(k)
        for k in ("model_args", "judge_args", "clusterer_args"):
            # results.json is shared: credentials never go in it
            d[k] = [redact(x) for x in d[k]] if isinstance(d[k], list) else redact(d[k])
        d["temperatures"] = list(self.temperatures)
        return d
