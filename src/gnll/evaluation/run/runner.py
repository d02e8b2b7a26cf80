"""The evaluation pipeline: greedy -> correctness -> beams -> samples -> clustering -> measures.

:class:`Evaluator` runs an :class:`~gnll.evaluation.run.config.EvalConfig`. Work is done in chunks of
questions (one ``Model.generate`` call per chunk and stage, so the backend can batch and
length-sort many prompts). A stage (:mod:`~gnll.evaluation.run.stages`) describes a chunk's work
(:class:`~gnll.evaluation.run.stages.Work`); a chunk mapper computes it (``map_works``: here, one
after another, by default; on Ray replicas with :mod:`gnll.distributed.evaluation`) and the stage
appends the records to its own flushed JSONL cache as soon as a chunk's arrive, so an interrupted
run continues with ``resume=True`` and recomputes nothing that reached the disk. Each task's fingerprint (model,
prompt, data, split; :mod:`~gnll.evaluation.run.store`) is checked on resume and a mismatch stops the
run with a message instead of mixing runs.

The sampling temperature is chosen on the held-out pool (:mod:`~gnll.evaluation.run.temperature`). At
the end, ``samples.jsonl`` is assembled from the caches in one streaming pass
(:mod:`~gnll.evaluation.run.assemble`), and results, tables and plots are computed from it.

(The configuration's example is in :mod:`~gnll.evaluation.run.config`.)
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gnll import measures as M
from gnll._util import jsonable, progress_enabled
from gnll._util.runfiles import RunDir
from gnll.backends.base import Generation, GenerationConfig, Model
from gnll.backends.identity import model_identity
from gnll.evaluation.data.tasks import get_task
from gnll.evaluation.results.portable import without_local_paths
from gnll.evaluation.run.assemble import assemble_record
from gnll.evaluation.run.cache import atomic_file, write_json_atomic, write_text_atomic
from gnll.evaluation.run.config import TEMPERATURES, EvalConfig
from gnll.evaluation.run.progress import SplitProgress, stage_weights
from gnll.evaluation.run.rundir import RunLock, changed_tasks
from gnll.evaluation.run.stages import Chunk, PromptsFailed, Stage, StageResult, TaskStages, Work
from gnll.evaluation.run.store import (
    FingerprintMismatchError,
    TaskRun,
    check_earlier_run,
    fingerprint,
    prepare_output_dir,
)
from gnll.evaluation.run.temperature import (
    choose_from_tables,
    choose_temperature,
    default_temperature,
    heldout_size,
)

if TYPE_CHECKING:
    from gnll.semantic import Clusterer

logger = logging.getLogger(__name__)

__all__ = [
    "TEMPERATURES",
    "EvalConfig",
    "Evaluator",
    "FingerprintMismatchError",
    "WorkMapper",
    "run_evaluation",
]

#: Computes the works of a stage (one per chunk) and yields their results in the same order: the
#: local engine is ``map`` in this process; :mod:`gnll.distributed.evaluation` maps on replicas.
WorkMapper = Callable[[Sequence[Work]], Iterable[StageResult]]


@dataclass(frozen=True)
class _TaskPlan:
    """A task whose stages have run: what its ``samples.jsonl`` records are assembled from."""

    stages: TaskStages
    metrics: list[str]
    temperature: dict[str, float] | None  # per sampling-based measure
    n: int


class _Timer:
    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def add(self, stage: str, dt: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + dt
        self.calls[stage] = self.calls.get(stage, 0) + 1


class Evaluator:
    """Runs an :class:`EvalConfig`.

    ``model``, ``judge`` and ``clusterer`` may be passed in (already loaded, or fakes in tests);
    otherwise they are loaded on first use, so a run whose every stage is cached loads nothing.

    ``map_works`` computes the works of a stage, one per chunk, in order (default: one after
    another in this process, with this evaluator's components); ``chunks_per_wave`` is how many
    chunks go through a stage together (``None``: a whole split, for a mapper that computes them
    in parallel). Either way the caches, ``samples.jsonl`` and ``results.json`` are the same.
    """

    def __init__(
        self,
        config: EvalConfig,
        *,
        model: Model | None = None,
        judge: Model | Sequence[Model] | None = None,
        clusterer: Clusterer | None = None,
        map_works: WorkMapper | None = None,
        chunks_per_wave: int | None = 1,
    ) -> None:
        self.config = config
        self.out = Path(config.output_path)
        self.files = RunDir(self.out)
        self._model = model
        if model is not None:
            self._check_capabilities(model)
        self._identity: dict[str, Any] | None = None
        # one judge passed in serves every judge of --judge A,B; a list gives each its own
        many = isinstance(judge, list | tuple)
        self._judge = None if many else judge
        self._judges: dict[int, Model] = dict(enumerate(judge)) if many else {}
        self._clusterer = clusterer
        self._clusterer_name = self._resolve_clusterer_name()
        self.timer = _Timer()
        self._noted: set[str] = set()
        self._progress: SplitProgress | None = None
        #: Whether the stages' work is computed in this process (no mapper given).
        self.computes_here = map_works is None
        self.map_works: WorkMapper = map_works or partial(map, self.compute)
        self.chunks_per_wave = chunks_per_wave

    # ------------------------------------------------------------------ lazily loaded components
    @property
    def model(self) -> Model:
        if self._model is None:
            self._model = self._load_model()
        return self._model

    def _load_model(self) -> Model:
        """The evaluated model, loaded and checked."""
        from gnll.backends import load_model

        logger.info("loading model %s", self.config.model)
        t = time.perf_counter()
        model = load_model(
            self.config.model, progress=self.config.progress, **self.config.model_args
        )
        self.timer.add("load_model", time.perf_counter() - t)
        self._check_capabilities(model)
        return model

    @property
    def judge(self) -> Model:
        """The first judge (see :meth:`judge_model`)."""
        return self.judge_model(0)

    def judge_model(self, index: int) -> Model:
        """The ``index``-th judge of ``--judge A,B``, loaded on first use (a judge passed in to the
        constructor serves every judge; one that is the evaluated model reuses it)."""
        if index not in self._judges:
            cfg = self.config
            name = cfg.judges[index]
            if self._judge is not None:
                self._judges[index] = self._judge
            elif name == cfg.model and cfg.judge_args_for(index) == cfg.model_args:
                self._judges[index] = self.model
            else:
                from gnll.backends import load_model

                t = time.perf_counter()
                args = cfg.judge_args_for(index)
                self._judges[index] = load_model(name, progress=cfg.progress, **args)
                self.timer.add("load_judge", time.perf_counter() - t)
        return self._judges[index]

    @property
    def clusterer(self) -> Clusterer:
        if self._clusterer is None:
            from gnll.evaluation.run.stages import load_run_clusterer

            t = time.perf_counter()
            # `auto` was resolved once at start-up so the cache fingerprint cannot drift
            self._clusterer = load_run_clusterer(self.config, self._clusterer_name)
            self.timer.add("load_clusterer", time.perf_counter() - t)
        return self._clusterer

    def clusterer_named(self, name: str) -> Clusterer:
        """The clusterer with ``auto`` resolved to ``name`` (a :class:`ClusterWork`'s: the driver's
        choice, so a replica whose own resolution differs clusters with the driver's)."""
        if self._clusterer is not None and name != self._clusterer_name:
            raise RuntimeError(f"the clusterer in use is {self._clusterer_name!r}, not {name!r}")
        self._clusterer_name = name
        return self.clusterer

    def _note_component(self, kind: str, info: dict[str, Any]) -> None:
        """Persist a component's ``info()`` the first time it is used (survives interruptions)."""
        if kind in self._noted:
            return
        self._noted.add(kind)
        path = self.files.components
        known = json.loads(path.read_text()) if path.exists() else {}
        known[kind] = jsonable(info, nan="keep")
        write_json_atomic(path, known)

    def _resolve_clusterer_name(self) -> str:
        if self._clusterer is not None:
            info = self._clusterer.info()
            return str(info.get("clusterer", info.get("name", type(self._clusterer).__name__)))
        name = self.config.clusterer
        if self.config.needs_clusters:
            from gnll.semantic import AUTO_NAMES, resolve_clusterer_name

            if name in AUTO_NAMES:
                return resolve_clusterer_name(name)
        return name

    # ------------------------------------------------------------------ what stages compute with
    def generate(
        self, model: Model, prompts: list[str], config: GenerationConfig
    ) -> list[list[Generation]]:
        hook: Any = False
        if self._progress is not None:
            progress, n = self._progress, len(prompts)

            def hook(done: float) -> None:
                progress.prompts_done(done, of=n)

        out = model.generate(prompts, config, batch_size=self.config.batch_size, progress=hook)
        if len(out) != len(prompts):
            raise RuntimeError(f"model returned {len(out)} outputs for {len(prompts)} prompts")
        return out

    def timed(self, label: str, seconds: float) -> None:
        self.timer.add(label, seconds)

    def _model_identity(self) -> dict[str, Any]:
        """What the evaluated model is (computed once, without loading it)."""
        if self._identity is None:
            self._identity = model_identity(self.config.model, self.config.model_args)
        return self._identity

    def compute(self, work: Work) -> StageResult:
        """``work`` computed with this evaluator's components (the local chunk mapper's step)."""
        return work.run(self)

    # ------------------------------------------------------------------ running a split
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
        """Run ``split``'s first ``n`` questions in chunks, with a progress bar labelled ``what``
        (default: the split's name)."""
        from tqdm.auto import tqdm

        cfg = self.config
        examples = stages.run.data.split(split, n)
        cs = cfg.chunk_size
        chunks = [
            Chunk(
                stages.run,
                split,
                start // cs,
                examples[start : start + cs],
                [(split, start + i) for i in range(len(examples[start : start + cs]))],
            )
            for start in range(0, len(examples), cs)
        ]
        bar = tqdm(
            total=len(examples),
            desc=f"{stages.run.name} [{what or split}]",
            unit="q",
            disable=not progress_enabled(cfg.progress),
            dynamic_ncols=True,
            mininterval=1.0,
            smoothing=0.1,
            bar_format=SplitProgress.BAR_FORMAT,
        )
        # The bar moves as the backend finishes prompts (SplitProgress), not once per chunk.
        progress = self._progress = SplitProgress(bar, stage_weights(cfg.beams, cfg.samples))
        steps = stages.steps(temperatures, metrics, beams=beams)
        wave = self.chunks_per_wave or max(1, len(chunks))
        try:
            for w in range(0, len(chunks), wave):
                part = chunks[w : w + wave]
                progress.start_chunk(sum(len(c.keys) for c in part), [lb for lb, _ in steps])
                for label, stage in steps:
                    progress.stage(label)
                    self._fill(stage, part)
                progress.end_chunk()
        finally:
            self._progress = None
            bar.close()

    def _fill(self, stage: Stage, chunks: list[Chunk]) -> None:
        """Compute and append ``stage``'s missing records of ``chunks`` (one work per chunk)."""
        todo = [(c, t, stage.batch(c, t)) for c in chunks if (t := stage.todo(c))]
        if todo:
            t0 = time.perf_counter()
            works = [stage.work(c, batch) for c, _, batch in todo]
            failed: list[PromptsFailed] = []
            for (chunk, missing, batch), res in zip(todo, self.map_works(works), strict=True):
                self._note_component(res.component, res.info)
                try:
                    stage.append(chunk, missing, batch, res)
                except PromptsFailed as e:  # the other chunks' records are saved first
                    failed.append(e)
            self.timer.add(stage.label, time.perf_counter() - t0)
            if failed:
                raise failed[0]
        for chunk in chunks:
            stage.check(chunk)

    # ------------------------------------------------------------------ temperature selection
    def _select_temperature(
        self,
        stages: TaskStages,
        metrics: list[str],
        siblings: Sequence[tuple[TaskStages, list[str]]] = (),
    ) -> tuple[dict[str, float] | None, dict[str, Any]]:
        """The sampling temperature of every sampling-based measure, and how it was chosen.

        ``siblings``: the other tasks of the same dataset when the choice is made per dataset
        (``--temperature_scope dataset``); their held-out AUROCs are pooled with this task's.
        """
        cfg = self.config
        if not cfg.needs_samples:
            return None, {"selected_by": "not needed"}
        sampling = [m for m in cfg.active_measures if M.get(m).uses_samples]
        if cfg.temperature is not None:
            fixed = dict.fromkeys(sampling, cfg.temperature)
            return fixed, {"selected_by": "fixed", "value": cfg.temperature, "per_measure": fixed}
        primary = metrics[0]
        tables, pooled, first = [], [], None
        for st, ms in [(stages, metrics), *siblings]:
            table, n, verdicts = self._heldout_table(st, ms[0], sampling)
            first = first or (n, verdicts)
            if table is not None:
                tables.append(table)
                pooled.append(st.run.name)
        if not tables:
            return self._default_temperature(sampling, primary, *first)
        temps, choice = choose_from_tables(
            cfg.temperatures, tables, sampling, cfg.temperature_selection, M.PAPER_BASELINES
        )
        values = list(temps.values())
        return temps, {
            "selected_by": "heldout",
            # the temperature most measures use (all of them with --temperature_selection shared)
            "value": max(sorted(set(values)), key=values.count),
            "metric": primary,
            "n_heldout": first[0],
            "measures": sampling,
            "scope": cfg.temperature_scope,
            **({"pooled_tasks": pooled} if cfg.temperature_scope == "dataset" else {}),
            **choice,
        }

    def _heldout_table(
        self, stages: TaskStages, primary: str, sampling: list[str]
    ) -> tuple[dict[str, Any] | None, int, list[bool | None]]:
        """Held-out AUROC of every sampling measure at every candidate temperature (``None`` when
        the held-out answers are all right or all wrong), the pool size and its verdicts."""
        cfg = self.config
        n = heldout_size(cfg, len(stages.run.data.heldout_idx))
        examples = stages.run.data.split("heldout", n)

        def records(temp: float | None) -> Iterator[dict[str, Any]]:
            for pos, ex in enumerate(examples):
                yield assemble_record(stages, ("heldout", pos), ex, [primary], temp, beams=False)

        # The held-out answers are judged before any sampling: when every verdict is the same no
        # candidate's AUROC is defined, and sampling them would not change the choice.
        self._run_split(stages, "heldout", n, [], [primary], beams=False, what="heldout: judging")
        verdicts = [r["correctness"][primary]["correct"] for r in records(None)]
        if len(set(verdicts) - {None}) < 2:
            return None, n, verdicts
        self._run_split(stages, "heldout", n, cfg.temperatures, [primary], beams=False)
        _, info = choose_temperature(
            cfg.temperatures, {t: list(records(t)) for t in cfg.temperatures}, primary, sampling
        )
        return info["candidates"], n, verdicts

    def _default_temperature(
        self, sampling: list[str], metric: str, n: int, verdicts: list[bool | None]
    ) -> tuple[dict[str, float], dict[str, Any]]:
        """The fallback of :func:`~.temperature.choose_temperatures` for a held-out pool whose
        answers are all right or all wrong, chosen without sampling it."""
        cfg = self.config
        best = default_temperature(cfg.temperatures)
        temps = dict.fromkeys(sampling, best)
        judged = [v for v in verdicts if v is not None]
        note = (
            f"all {len(judged)} judged held-out answers are "
            f"{'right' if judged and judged[0] else 'wrong'}: no temperature can be ranked, so "
            "the default was used and the held-out questions were not sampled"
        )
        return temps, {
            "selected_by": "heldout",
            "value": best,
            "metric": metric,
            "n_heldout": n,
            "measures": sampling,
            "mode": cfg.temperature_selection,
            "single_class": True,
            "candidates": {},
            "per_measure": temps,
            "notes": dict.fromkeys(sampling, note),
        }

    # ------------------------------------------------------------------ main entry point
    def _check_capabilities(self, model: Model) -> None:
        """Refuse measures the backend cannot compute before any work (e.g. BS-MSP on a server)."""
        bad = M.unsupported(self.config.active_measures, model.capabilities)
        if bad:
            ok = [m for m in self.config.active_measures if m not in bad]
            lacks = ", ".join(f"{m} (needs {'/'.join(c)})" for m, c in bad.items())
            raise ValueError(
                f"model {self.config.model!r} cannot compute {lacks} on this backend; it can run "
                f"{', '.join(ok) or 'none of the selected measures'}: pass --measures "
                f"{','.join(ok) or 'g-nll'}"
            )
        sampled = [m for m in self.config.active_measures if M.get(m).uses_samples]
        if (
            self.config.sample_logprobs == "sampling"
            and sampled
            and model.capabilities.missing(["sampling_logprobs"])
        ):
            # servers return temperature-1 log-probs only: a silent fallback would change PE/SE
            raise ValueError(
                f"--sample_logprobs sampling needs the samples' log-probs under the tempered "
                f"sampling distribution, which model {self.config.model!r} does not report on this "
                "backend (OpenAI-compatible servers return temperature-1 log-probs only); use "
                "--sample_logprobs model or the hf backend"
            )

    def run(self) -> dict[str, Any]:
        cfg = self.config
        t0 = time.perf_counter()
        # Load every task's data and check every fingerprint before generating anything (and before
        # touching the output directory), so a missing file or a mismatched cache fails in seconds.
        datas = [
            get_task(name).load(
                seed=cfg.seed,
                data_dir=cfg.data_dir,
                data_path=cfg.data_path,
                source=cfg.data_source,
                split_path=cfg.split_path,
                pool_path=cfg.pool_path,
            )
            for name in cfg.tasks
        ]
        for td in datas:
            td.fewshot_as_multiturn = cfg.fewshot_as_multiturn
        if self._model is None and self.computes_here and not (cfg.resume and self.out.exists()):
            # A new run computes everything, so it needs the model: loaded before the run
            # directory exists, a mistyped --model leaves nothing behind. (A resumed run loads it
            # only if something is left to compute.) What refuses the directory is checked first,
            # so a refused command costs no model load.
            RunLock(self.out).check_free()
            check_earlier_run(self.out, resume=cfg.resume, overwrite=cfg.overwrite)
            self._model = self._load_model()
        # One run per directory at a time, for the whole run (released on any exit).
        with RunLock(self.out):
            prepare_output_dir(self.out, resume=cfg.resume, overwrite=cfg.overwrite)
            said = changed_tasks(self.files.run_json, self.out, cfg.tasks) if cfg.resume else None
            if said:
                logger.warning("%s", said)
            runs = [
                TaskRun.open(self.out, data, fingerprint(cfg, data, self._model_identity()))
                for data in datas
            ]
            # Only now, with every fingerprint checked, may run.json describe this directory.
            write_json_atomic(
                self.files.run_json, {"config": cfg.public(), "output_path": str(self.out)}
            )
            return self._run_tasks(runs, t0)

    def _run_tasks(self, runs: list[TaskRun], t0: float) -> dict[str, Any]:
        from gnll.evaluation.results import report, tables

        cfg = self.config
        task_meta: dict[str, Any] = {}
        plan: list[_TaskPlan] = []
        built = [
            (
                run,
                TaskStages(run, cfg, self._clusterer_name),
                cfg.correctness_for(run.data.task),
            )
            for run in runs
        ]
        by_dataset: dict[str, tuple[dict[str, float] | None, dict[str, Any]]] = {}
        for run, stages, metrics in built:
            task = run.data.task
            if "f1" in metrics and task.mode == "long":
                logger.warning("%s: F1 is only meaningful for short answers", task.name)
            if cfg.temperature_scope == "dataset":
                # App. D: one choice "for each dataset", shared by its short and long tasks
                if task.dataset not in by_dataset:
                    siblings = [
                        (st, ms)
                        for r, st, ms in built
                        if r.data.task.dataset == task.dataset and r is not run
                    ]
                    by_dataset[task.dataset] = self._select_temperature(stages, metrics, siblings)
                temp, selection = by_dataset[task.dataset]
            else:
                temp, selection = self._select_temperature(stages, metrics)
            n_pool = len(run.data.eval_idx)
            n = n_pool if cfg.limit is None else min(cfg.limit, n_pool)
            temps = sorted(set(temp.values())) if temp else []
            self._run_split(stages, "eval", n, temps, metrics, beams=cfg.needs_beams)
            task_meta[task.name] = {
                **{k: v for k, v in run.data.describe().items() if k != "prompt_prefix"},
                "n_eval": n,
                # gnll's instruction prompt with few-shot blocks (gnll.backends.prompting)
                "prompt_format": "instruction",
                "correctness": metrics,
                "temperature": selection,
            }
            plan.append(_TaskPlan(stages, metrics, temp, n))

        # Assemble samples.jsonl in one streaming pass over the caches.
        t = time.perf_counter()
        samples_path = self.files.samples
        # fsynced before the rename and the directory after it (atomic_file)
        with atomic_file(samples_path) as fh:
            for p in plan:
                for pos, ex in enumerate(p.stages.run.data.split("eval", p.n)):
                    r = assemble_record(
                        p.stages, ("eval", pos), ex, p.metrics, p.temperature, beams=cfg.needs_beams
                    )
                    fh.write(json.dumps(r, ensure_ascii=False) + "\n")
        self.timer.add("assemble", time.perf_counter() - t)

        t = time.perf_counter()
        info = self._component_info()
        # results.json is the file people share: no paths of this machine in it
        options = report.ReportOptions(
            model=cfg.model,
            config=cfg.public(),
            n_boot=cfg.n_boot,
            seed=cfg.seed,
            f1_rule=cfg.f1_rule,
        )
        results = without_local_paths(report.build_results(samples_path, options, task_meta, info))
        write_json_atomic(self.files.results, results)
        write_text_atomic(self.files.table, tables.render_table([results]))
        self.timer.add("metrics", time.perf_counter() - t)
        if cfg.plots:
            from gnll.evaluation.results import plots

            t = time.perf_counter()
            plots.make_plots(samples_path, results, self.files.plots)
            self.timer.add("plots", time.perf_counter() - t)
        self.timer.add("total", time.perf_counter() - t0)
        write_json_atomic(
            self.files.timings,
            {
                "seconds": self.timer.seconds,
                "calls": self.timer.calls,
                "note": "this invocation only",
            },
        )
        return results

    def _component_info(self) -> dict[str, Any]:
        """Model / judge / clusterer descriptions (``components.json``, written on first use)."""
        path = self.files.components
        info: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        info.setdefault("model", {"name": self.config.model})
        for metric, name in zip(self.config.judge_metrics, self.config.judges, strict=True):
            info.setdefault(metric, {"name": name})
        if self.config.needs_clusters:
            info.setdefault("clusterer", {"name": self._clusterer_name})
        write_json_atomic(path, info)
        return info


def run_evaluation(config: EvalConfig, **components: Any) -> dict[str, Any]:
    """Run ``config`` and return the results dictionary (also written to ``output_path``)."""
    return Evaluator(config, **components).run()
