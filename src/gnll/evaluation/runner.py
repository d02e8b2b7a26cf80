"""The evaluation pipeline: greedy -> correctness -> beams -> samples -> clustering -> measures.

Work is done in chunks of questions (one ``Model.generate`` call per chunk and stage, so the
backend can
batch and length-sort many prompts). Every stage's output is appended to its own flushed JSONL cache
(:mod:`gnll.evaluation.cache`) as soon as a chunk finishes, so an interrupted run continues with
``resume=True`` and recomputes nothing that reached the disk. Cache files are named by a hash of the
configuration that produced them; the task's fingerprint (model, prompt, data, split) is checked on
resume and a mismatch stops the run with a message instead of mixing runs.

Sampling is seeded per (task, split, temperature, chunk), so a resumed run reproduces an
uninterrupted
one. At the end, ``samples.jsonl`` is assembled from the caches in one streaming pass, and results,
tables and plots are computed from it.

Example
-------
>>> cfg = EvalConfig(model="smollm2-135m-instruct", tasks=["svamp_short"], output_path="runs/x",
...                  measures=["g-nll"], limit=20)
>>> cfg.needs_samples, cfg.needs_beams
(False, False)
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gnll import measures as M
from gnll.backends.base import Generation, GenerationConfig, Model
from gnll.backends.identity import (
    describe_diff,
    fill_unknown,
    model_identity,
    outcome_args,
    redact,
)
from gnll.evaluation.cache import JsonlCache, write_json_atomic
from gnll.evaluation.correctness import (
    CORRECTNESS_METRICS,
    F1_RULES,
    contains_match,
    f1_verdict,
    judge_verdict,
)
from gnll.evaluation.datasets import Example
from gnll.evaluation.metrics import auroc
from gnll.evaluation.prompts import judge_prompt
from gnll.evaluation.tasks import Task, TaskData, get_task

logger = logging.getLogger(__name__)

__all__ = [
    "EvalConfig",
    "Evaluator",
    "FingerprintMismatchError",
    "run_evaluation",
]

TEMPERATURES = (0.5, 1.0, 1.5)
JUDGE_CONFIG = GenerationConfig.greedy(max_new_tokens=8, stop=("\n",))
CACHE_VERSION = 2
#: Files and folders an evaluation writes into its output directory (and clears when starting over).
OUTPUT_ENTRIES = (
    "run.json",
    "components.json",
    "tasks",
    "samples.jsonl",
    "results.json",
    "table.md",
    "plots",
    "timings.json",
)


class FingerprintMismatchError(RuntimeError):
    """The output directory holds a run with a different model, prompt or data."""


def _hash(obj: Any, n: int = 12) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[
        :n
    ]


def _seed(*parts: Any) -> int:
    return int(_hash([str(p) for p in parts], 8), 16) & 0x7FFFFFFF


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
    data_source: str = "local"
    split_path: str | None = None  # ids of the evaluation pool (e.g. a test split), one per line
    pool_path: str | None = None  # a file the few-shot and held-out pools come from instead
    correctness: list[str] | None = None
    judge: str | None = None
    judge_args: dict[str, Any] = field(default_factory=dict)
    beams: int = 5
    samples: int = 10
    temperature: float | None = None
    temperatures: tuple[float, ...] = TEMPERATURES
    measures: list[str] = field(default_factory=lambda: list(M.ORDER))
    batch_size: int | None = None
    chunk_size: int = 64
    seed: int = 0
    resume: bool = False
    clusterer: str = "auto"
    clusterer_args: dict[str, Any] = field(default_factory=dict)
    semantic_relation: str | None = None
    heldout_size: int | None = None  # None: min(100, limit)
    fewshot_as_multiturn: bool = False
    n_boot: int = 1000
    f1_rule: str = "gt"  # the paper's "F1 exceeds 0.5"; "ge" is the reference code's >= 0.5
    plots: bool = True
    progress: bool = True

    def __post_init__(self) -> None:
        self.output_path = Path(self.output_path)
        self.tasks = [get_task(t).name for t in self.tasks]
        self.measures = M.validate(self.measures, paper_order=True)
        if self.correctness is not None:
            bad = [c for c in self.correctness if c not in CORRECTNESS_METRICS]
            if bad:
                raise ValueError(
                    f"unknown correctness metric(s) {bad}; choose from {CORRECTNESS_METRICS}"
                )
            if "judge" in self.correctness and not self.judge:
                raise ValueError("correctness 'judge' needs a judge model: give --judge MODEL")
        if self.beams < 0 or self.samples < 0:
            raise ValueError("--beams and --samples must be >= 0")
        if self.samples == 1 and self.needs_samples:
            logger.warning(
                "--samples 1: sampling-based measures from a single sample are degenerate"
            )
        if self.temperature is not None and not (
            self.temperature > 0 and math.isfinite(self.temperature)
        ):
            raise ValueError(f"--temperature must be positive, got {self.temperature}")
        if self.limit is not None and self.limit < 1:
            raise ValueError("--limit must be >= 1")
        if self.chunk_size < 1:
            raise ValueError("--chunk_size must be >= 1")
        if self.f1_rule not in F1_RULES:
            raise ValueError(f"--f1_rule must be one of {F1_RULES}, got {self.f1_rule!r}")

    @property
    def needs_beams(self) -> bool:
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
        have = M.Needs.GREEDY
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

    def correctness_for(self, task: Task) -> list[str]:
        """Correctness metrics of ``task``; the first is the primary one (temperature selection)."""
        if self.correctness is not None:
            return list(dict.fromkeys(self.correctness))
        if self.judge:
            return ["f1", "judge"] if task.mode == "short" else ["judge", "contains"]
        return list(task.default_correctness)

    def public(self) -> dict[str, Any]:
        """The configuration as recorded in results (run mechanics such as paths are left out)."""
        d = asdict(self)
        for k in ("output_path", "resume", "progress", "plots"):
            d.pop(k)
        for k in ("model_args", "judge_args", "clusterer_args"):
            d[k] = redact(d[k])  # results.json is shared: credentials never go in it
        d["temperatures"] = list(self.temperatures)
        return d


def _cost(gen: dict) -> int:
    return len(gen["token_ids"]) + len(gen.get("terminator_token_ids") or [])


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
    """

    def __init__(
        self,
        config: EvalConfig,
        *,
        model: Model | None = None,
        judge: Model | None = None,
        clusterer: Any = None,
    ) -> None:
        self.config = config
        self.out = Path(config.output_path)
        self._model = model
        self._identity: dict[str, Any] | None = None
        self._judge = judge
        self._clusterer = clusterer
        self._clusterer_name = self._resolve_clusterer_name()
        self.timer = _Timer()
        self._caches: dict[Path, JsonlCache] = {}
        self._noted: set[str] = set()

    # ------------------------------------------------------------------ lazily loaded components
    @property
    def model(self) -> Model:
        if self._model is None:
            from gnll.backends import load_model

            logger.info("loading model %s", self.config.model)
            t = time.perf_counter()
            self._model = load_model(
                self.config.model, progress=self.config.progress, **self.config.model_args
            )
            self.timer.add("load_model", time.perf_counter() - t)
        self._note_component("model", self._model)
        return self._model

    @property
    def judge(self) -> Model:
        if self._judge is None:
            cfg = self.config
            if cfg.judge == cfg.model and cfg.judge_args == cfg.model_args:
                self._judge = self.model
            else:
                from gnll.backends import load_model

                t = time.perf_counter()
                self._judge = load_model(cfg.judge, progress=cfg.progress, **cfg.judge_args)
                self.timer.add("load_judge", time.perf_counter() - t)
        self._note_component("judge", self._judge)
        return self._judge

    @property
    def clusterer(self) -> Any:
        if self._clusterer is None:
            from gnll.semantic import load_clusterer

            t = time.perf_counter()
            name = self.config.clusterer
            relation = self.config.semantic_relation
            if name in ("auto", "default"):
                if relation is not None and self._clusterer_name not in ("nli", "llm"):
                    logger.warning(
                        "--semantic_relation %s ignored: 'auto' chose the %s clusterer, which has "
                        "no entailment relation (pass --clusterer nli or llm to use it)",
                        relation,
                        self._clusterer_name,
                    )
                # The name was resolved once at start-up so the cache fingerprint cannot drift.
                name = self._clusterer_name
                if name not in ("nli", "llm"):
                    relation = None
            self._clusterer = load_clusterer(name, relation=relation, **self.config.clusterer_args)
            self.timer.add("load_clusterer", time.perf_counter() - t)
        self._note_component("clusterer", self._clusterer)
        return self._clusterer

    def _note_component(self, kind: str, obj: Any) -> None:
        """Persist ``obj.info()`` the first time a component is used (survives interruptions)."""
        if kind in self._noted or not hasattr(obj, "info"):
            return
        self._noted.add(kind)
        path = self.out / "components.json"
        info = json.loads(path.read_text()) if path.exists() else {}
        info[kind] = _jsonable(obj.info())
        write_json_atomic(path, info)

    def _resolve_clusterer_name(self) -> str:
        if self._clusterer is not None:
            info = self._clusterer.info() if hasattr(self._clusterer, "info") else {}
            return str(info.get("clusterer", info.get("name", type(self._clusterer).__name__)))
        name = self.config.clusterer
        if name in ("auto", "default") and self.config.needs_clusters:
            from gnll.semantic import default_clusterer_name

            return default_clusterer_name()
        return name

    # ------------------------------------------------------------------ output directory
    def _prepare_output_dir(self) -> None:
        self.out.mkdir(parents=True, exist_ok=True)
        if not self.config.resume:
            removed = []
            for name in OUTPUT_ENTRIES:
                p = self.out / name
                if p.is_dir():
                    shutil.rmtree(p)
                    removed.append(name)
                elif p.exists():
                    p.unlink()
                    removed.append(name)
            if removed:
                logger.warning(
                    "%s: starting over (removed %s; pass --resume to continue a run)",
                    self.out,
                    removed,
                )

    def _fingerprint(self, td: TaskData) -> dict[str, Any]:
        cfg = self.config
        return {
            "cache_version": CACHE_VERSION,
            "model": cfg.model,
            # Throughput knobs may change on resume (lower max_batch_tokens after an OOM);
            # secrets are never written; what the model *is* must not change.
            "model_args": outcome_args(cfg.model_args),
            "model_identity": self._model_identity(),
            "task": td.task.name,
            "prompt_prefix": td.prefix,
            "max_new_tokens": td.task.max_new_tokens,
            "data": {
                k: td.data_info.get(k) for k in ("dataset", "source", "sha256", "hub_id", "n")
            },
            "split_seed": td.seed,
            "pools": [len(td.heldout_idx), len(td.eval_idx)],
            # which questions the pools hold (a split file or pool file changes them)
            "pool_ids": _hash(
                [
                    [td.examples[i].id for i in td.heldout_idx],
                    [td.examples[i].id for i in td.eval_idx],
                ]
            ),
        }

    def _model_identity(self) -> dict[str, Any]:
        """What the evaluated model is (computed once, without loading it)."""
        if self._identity is None:
            self._identity = model_identity(self.config.model, self.config.model_args)
        return self._identity

    def _check_fingerprint(self, td: TaskData, tdir: Path) -> dict[str, Any]:
        fp = self._fingerprint(td)
        path = tdir / "fingerprint.json"
        if path.exists():
            old = json.loads(path.read_text())
            new = _jsonable(fp)
            if fill_unknown(old, new) == new:
                # Same run; a hub commit unknown before the first download is not a change,
                # but once known it is recorded, so a different commit is refused later on.
                if old != new:
                    write_json_atomic(path, fp)
                return fp
            diffs = ["  " + line for line in describe_diff(old, new)]
            raise FingerprintMismatchError(
                f"{tdir} holds results of task {td.task.name} produced with a different "
                "configuration:\n"
                + "\n".join(diffs)
                + "\nThe cached generations do not belong to this run. Use a new "
                "--output_path, or run "
                f"without --resume to start {self.out} over."
            )
        else:
            tdir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, fp)
        return fp

    def _cache(self, tdir: Path, stage: str, header: dict[str, Any]) -> JsonlCache:
        path = tdir / "cache" / f"{stage}-{_hash(header)}.jsonl"
        if path not in self._caches:
            self._caches[path] = JsonlCache(path, header)
        return self._caches[path]

    # ------------------------------------------------------------------ stage caches of a task
    def _stage_caches(self, td: TaskData, tdir: Path, fp: dict[str, Any]) -> dict[str, Any]:
        cfg = self.config
        base = {"fingerprint": _fp_key(fp)}
        max_new = td.task.max_new_tokens
        greedy_cfg = GenerationConfig.greedy(max_new_tokens=max_new, seed=None)
        caches: dict[str, Any] = {"greedy_cfg": greedy_cfg}
        gh = {**base, "stage": "greedy", "generation": greedy_cfg.to_dict()}
        caches["greedy"] = self._cache(tdir, "greedy", gh)
        if cfg.judge:
            jh = {
                **base,
                "stage": "judge",
                "greedy": _hash(gh),
                "judge": cfg.judge,
                "judge_args": outcome_args(cfg.judge_args),
                "generation": JUDGE_CONFIG.to_dict(),
                # the judge prompt's wording (a change invalidates the judgements)
                "prompt": _hash(
                    judge_prompt("Q?", ["A", "B"], "P") + judge_prompt("Q?", ["A"], "P")
                ),
            }
            caches["judge"] = (self._cache(tdir, "judge", jh), jh)
        if cfg.needs_beams:
            beam_cfg = GenerationConfig.beam(cfg.beams, max_new_tokens=max_new, seed=None)
            bh = {**base, "stage": "beams", "generation": beam_cfg.to_dict()}
            caches["beams"] = (self._cache(tdir, "beams", bh), beam_cfg)
        return caches

    def _sample_cache(
        self, td, tdir, fp, temperature: float
    ) -> tuple[JsonlCache, GenerationConfig, dict]:
        cfg = self.config
        scfg = GenerationConfig.sample(
            cfg.samples,
            temperature=temperature,
            max_new_tokens=td.task.max_new_tokens,
            seed=cfg.seed,
        )
        sh = {"fingerprint": _fp_key(fp), "stage": "samples", "generation": scfg.to_dict()}
        return self._cache(tdir, f"samples-t{temperature:g}", sh), scfg, sh

    def _cluster_cache(self, tdir, sample_header: dict, temperature: float) -> JsonlCache:
        ch = {
            "stage": "clusters",
            "samples": _hash(sample_header),
            "clusterer": self._clusterer_name,
            "clusterer_args": outcome_args(self.config.clusterer_args),
            "relation": self.config.semantic_relation,
        }
        return self._cache(tdir, f"clusters-t{temperature:g}", ch)

    # ------------------------------------------------------------------ running stages
    def _fill(
        self,
        cache: JsonlCache,
        keys: list[tuple[str, int]],
        stage: str,
        compute: Callable[[list[int]], list[dict[str, Any]]],
    ) -> list[dict[str, Any]]:
        """Records of ``keys`` from ``cache``; missing ones are computed and appended."""
        todo = [i for i, k in enumerate(keys) if not cache.has(k)]
        if todo:
            t = time.perf_counter()
            cache.append(compute(todo))
            self.timer.add(stage, time.perf_counter() - t)
        return cache.get_many(keys)

    def _generate(
        self, model: Model, prompts: list[str], gcfg: GenerationConfig
    ) -> list[list[Generation]]:
        out = model.generate(prompts, gcfg, batch_size=self.config.batch_size, progress=False)
        if len(out) != len(prompts):
            raise RuntimeError(f"model returned {len(out)} outputs for {len(prompts)} prompts")
        return out

    def _run_split(
        self,
        td: TaskData,
        tdir: Path,
        fp: dict[str, Any],
        split: str,
        n: int,
        temperatures: Sequence[float],
        metrics: list[str],
        *,
        beams: bool,
    ) -> None:
        from tqdm.auto import tqdm

        cfg = self.config
        caches = self._stage_caches(td, tdir, fp)
        examples = td.split(split, n)
        cs = cfg.chunk_size
        bar = tqdm(
            total=len(examples),
            desc=f"{td.task.name} [{split}]",
            unit="q",
            disable=not cfg.progress or os.environ.get("GNLL_NO_PROGRESS") == "1",
            dynamic_ncols=True,
            mininterval=1.0,
            smoothing=0.1,
        )
        try:
            for start in range(0, len(examples), cs):
                chunk = examples[start : start + cs]
                keys = [(split, start + i) for i in range(len(chunk))]
                chunk_no = start // cs
                self._run_chunk(
                    td, tdir, fp, caches, chunk, keys, chunk_no, temperatures, metrics, beams, bar
                )
                bar.update(len(chunk))
        finally:
            bar.close()

    def _run_chunk(
        self, td, tdir, fp, caches, chunk, keys, chunk_no, temperatures, metrics, beams, bar
    ):
        cfg = self.config
        prompts_cache: list[str] | None = None

        def prompts() -> list[str]:
            nonlocal prompts_cache
            if prompts_cache is None:
                prompts_cache = [td.prompt(ex) for ex in chunk]
            return prompts_cache

        def rec(i: int, **data: Any) -> dict[str, Any]:
            return {"k": list(keys[i]), "id": chunk[i].id, **data}

        # 1. greedy reference answer
        bar.set_postfix_str("greedy", refresh=False)

        def do_greedy(todo: list[int]) -> list[dict]:
            ps = [prompts()[i] for i in todo]
            gens = self._generate(self.model, ps, caches["greedy_cfg"])
            return [
                rec(i, prompt=self.model.render_prompt(p), gen=g[0].to_dict())
                for i, p, g in zip(todo, ps, gens, strict=True)
            ]

        greedy = self._fill(caches["greedy"], keys, "greedy", do_greedy)
        for i, r in enumerate(greedy):
            if r["id"] != chunk[i].id:
                raise RuntimeError(
                    f"cache {caches['greedy'].path} is out of step with the data (id {r['id']})"
                )

        # 2. correctness by judge (f1/contains are cheap and computed when assembling)
        if "judge" in metrics and "judge" in caches:
            bar.set_postfix_str("judge", refresh=False)
            jcache, _ = caches["judge"]

            def do_judge(todo: list[int]) -> list[dict]:
                jp = [
                    judge_prompt(
                        td.task.judge_question(chunk[i]), chunk[i].answers, greedy[i]["gen"]["text"]
                    )
                    for i in todo
                ]
                replies = self._generate(self.judge, jp, JUDGE_CONFIG)
                return [
                    rec(i, reply=r[0].text, verdict=judge_verdict(r[0].text).detail)
                    for i, r in zip(todo, replies, strict=True)
                ]

            self._fill(jcache, keys, "judge", do_judge)

        # 3. beam search (MSP estimate)
        if beams and "beams" in caches:
            bar.set_postfix_str("beams", refresh=False)
            bcache, bcfg = caches["beams"]

            def do_beams(todo: list[int]) -> list[dict]:
                gens = self._generate(self.model, [prompts()[i] for i in todo], bcfg)
                return [
                    rec(i, gens=[g.to_dict() for g in gs]) for i, gs in zip(todo, gens, strict=True)
                ]

            self._fill(bcache, keys, "beams", do_beams)

        # 4. samples and 5. their semantic clusters, per temperature
        for temp in temperatures:
            scache, scfg, sh = self._sample_cache(td, tdir, fp, temp)
            bar.set_postfix_str(f"samples T={temp:g}", refresh=False)
            seeded = scfg.replace(seed=_seed(cfg.seed, td.task.name, keys[0][0], temp, chunk_no))

            def do_samples(todo: list[int], seeded: GenerationConfig = seeded) -> list[dict]:
                gens = self._generate(self.model, [prompts()[i] for i in todo], seeded)
                return [
                    rec(i, gens=[g.to_dict() for g in gs]) for i, gs in zip(todo, gens, strict=True)
                ]

            samples = self._fill(scache, keys, f"samples_t{temp:g}", do_samples)
            if self.config.needs_clusters:
                bar.set_postfix_str(f"clusters T={temp:g}", refresh=False)
                ccache = self._cluster_cache(tdir, sh, temp)

                def do_clusters(todo: list[int], samples: list[dict] = samples) -> list[dict]:
                    qs = [td.task.judge_question(chunk[i]) for i in todo]
                    answers = [[g["text"] for g in samples[i]["gens"]] for i in todo]
                    ids = self.clusterer.cluster_many(qs, answers)
                    return [
                        rec(i, cluster_ids=[int(c) for c in cid])
                        for i, cid in zip(todo, ids, strict=True)
                    ]

                self._fill(ccache, keys, "clusters", do_clusters)

    # ------------------------------------------------------------------ assembling records
    def _record(
        self,
        td: TaskData,
        tdir: Path,
        fp: dict[str, Any],
        key: tuple[str, int],
        example: Example,
        metrics: list[str],
        temperature: float | None,
        beams: bool,
    ) -> dict[str, Any]:
        cfg = self.config
        caches = self._stage_caches(td, tdir, fp)
        g = caches["greedy"].get(key)
        greedy = g["gen"]
        text = greedy["text"]
        correctness: dict[str, Any] = {}
        for metric in metrics:
            if metric == "f1":
                correctness["f1"] = f1_verdict(
                    text, example.answers, example.numeric_answer, cfg.f1_rule
                ).to_dict()
            elif metric == "contains":
                correctness["contains"] = contains_match(
                    text, example.answers, example.numeric_answer
                ).to_dict()
            elif metric == "judge":
                jcache, _ = caches["judge"]
                j = jcache.get(key)
                v = judge_verdict(j["reply"])
                correctness["judge"] = {**v.to_dict(), "reply": j["reply"], "judge": cfg.judge}
        record: dict[str, Any] = {
            "task": td.task.name,
            "split": key[0],
            "pos": key[1],
            "id": example.id,
            "question": example.question,
        }
        if example.context:
            record["context"] = example.context
        record["answers"] = list(example.answers)
        record["prompt"] = g["prompt"]
        record["greedy"] = greedy
        record["correctness"] = correctness
        cost = {"greedy": _cost(greedy)}
        beam_gens = samples = cluster_ids = None
        if beams and "beams" in caches:
            beam_gens = caches["beams"][0].get(key)["gens"]
            record["beams"] = beam_gens
            cost["beams"] = sum(_cost(b) for b in beam_gens)
        if temperature is not None and cfg.needs_samples:
            scache, _, sh = self._sample_cache(td, tdir, fp, temperature)
            samples = scache.get(key)["gens"]
            if cfg.needs_clusters:
                cluster_ids = self._cluster_cache(tdir, sh, temperature).get(key)["cluster_ids"]
                for s, c in zip(samples, cluster_ids, strict=True):
                    s["cluster_id"] = c
            record["temperature"] = temperature
            record["samples"] = samples
            cost["samples"] = sum(_cost(s) for s in samples)
        evidence = M.Evidence.of(
            greedy["token_logprobs"],
            None if beam_gens is None else [b["token_logprobs"] for b in beam_gens],
            None if samples is None else [s["token_logprobs"] for s in samples],
            cluster_ids,
        )
        record["measures"] = {
            m: M.get(m).compute(evidence)
            for m in M.computable(cfg.active_measures, evidence.available)
        }
        record["cost_tokens"] = cost
        return record

    # ------------------------------------------------------------------ temperature selection
    def _select_temperature(self, td, tdir, fp, metrics) -> tuple[float | None, dict[str, Any]]:
        cfg = self.config
        if not cfg.needs_samples:
            return None, {"selected_by": "not needed"}
        if cfg.temperature is not None:
            return cfg.temperature, {"selected_by": "fixed", "value": cfg.temperature}
        wanted = cfg.heldout_size if cfg.heldout_size is not None else min(100, cfg.limit or 100)
        n = min(wanted, len(td.heldout_idx))
        if n < 2:
            raise ValueError(
                "temperature selection needs a held-out pool; give --temperature or "
                "--heldout_size >= 2"
            )
        primary = metrics[0]
        self._run_split(td, tdir, fp, "heldout", n, cfg.temperatures, [primary], beams=False)
        sampling = [m for m in cfg.active_measures if M.get(m).uses_samples]
        table: dict[str, Any] = {}
        examples = td.split("heldout", n)
        for temp in cfg.temperatures:
            correct, scores = [], {m: [] for m in sampling}
            for pos, ex in enumerate(examples):
                r = self._record(td, tdir, fp, ("heldout", pos), ex, [primary], temp, beams=False)
                c = r["correctness"][primary]["correct"]
                if c is None:
                    continue
                correct.append(float(c))
                for m in sampling:
                    scores[m].append(r["measures"][m])
            aucs = {m: auroc(correct, scores[m]) if correct else float("nan") for m in sampling}
            finite = [a for a in aucs.values() if not math.isnan(a)]
            table[f"{temp:g}"] = {
                "auroc": aucs,
                "mean_auroc": sum(finite) / len(finite) if finite else float("nan"),
                "n": len(correct),
                "accuracy": sum(correct) / len(correct) if correct else float("nan"),
            }
        finite_t = [t for t in cfg.temperatures if not math.isnan(table[f"{t:g}"]["mean_auroc"])]
        if finite_t:
            best = max(finite_t, key=lambda t: table[f"{t:g}"]["mean_auroc"])  # first of ties
            note = "best mean AUROC of the sampling-based measures on the held-out pool"
        else:
            best = 1.0 if 1.0 in cfg.temperatures else cfg.temperatures[0]
            note = (
                "held-out pool has a single correctness class; fell back to the default temperature"
            )
        return best, {
            "selected_by": "heldout",
            "value": best,
            "metric": primary,
            "n_heldout": n,
            "measures": sampling,
            "candidates": table,
            "note": note,
        }

    # ------------------------------------------------------------------ main entry point
    def run(self) -> dict[str, Any]:
        from gnll.evaluation import report

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
        self._prepare_output_dir()
        write_json_atomic(
            self.out / "run.json", {"config": cfg.public(), "output_path": str(self.out)}
        )
        task_meta: dict[str, Any] = {}
        plan: list[tuple[TaskData, Path, dict, list[str], float | None, int]] = []
        loaded = []
        for td in datas:
            tdir = self.out / "tasks" / td.task.name
            loaded.append((td.task.name, td, tdir, self._check_fingerprint(td, tdir)))
        for name, td, tdir, fp in loaded:
            task = td.task
            metrics = self.config.correctness_for(task)
            if "f1" in metrics and task.mode == "long":
                logger.warning(
                    "%s: F1 is only meaningful for short answers (PROTOCOL.md section 3)", name
                )
            temp, selection = self._select_temperature(td, tdir, fp, metrics)
            n = len(td.eval_idx) if cfg.limit is None else min(cfg.limit, len(td.eval_idx))
            self._run_split(
                td,
                tdir,
                fp,
                "eval",
                n,
                [temp] if temp is not None else [],
                metrics,
                beams=cfg.needs_beams,
            )
            task_meta[name] = {
                **{k: v for k, v in td.describe().items() if k != "prompt_prefix"},
                "n_eval": n,
                "correctness": metrics,
                "temperature": selection,
            }
            plan.append((td, tdir, fp, metrics, temp, n))

        # Assemble samples.jsonl in one streaming pass over the caches.
        t = time.perf_counter()
        samples_path = self.out / "samples.jsonl"
        tmp = samples_path.with_name(".samples.jsonl.tmp")
        with tmp.open("w", encoding="utf-8") as fh:
            for td, tdir, fp, metrics, temp, n in plan:
                for pos, ex in enumerate(td.split("eval", n)):
                    r = self._record(
                        td, tdir, fp, ("eval", pos), ex, metrics, temp, cfg.needs_beams
                    )
                    fh.write(json.dumps(r, ensure_ascii=False) + "\n")
        tmp.replace(samples_path)
        self.timer.add("assemble", time.perf_counter() - t)

        t = time.perf_counter()
        info = self._component_info()
        results = report.build_results(samples_path, cfg, task_meta, info)
        write_json_atomic(self.out / "results.json", results)
        (self.out / "table.md").write_text(report.render_table([results]), encoding="utf-8")
        self.timer.add("metrics", time.perf_counter() - t)
        if cfg.plots:
            from gnll.evaluation import plots

            t = time.perf_counter()
            plots.make_plots(samples_path, results, self.out / "plots")
            self.timer.add("plots", time.perf_counter() - t)
        self.timer.add("total", time.perf_counter() - t0)
        write_json_atomic(
            self.out / "timings.json",
            {
                "seconds": self.timer.seconds,
                "calls": self.timer.calls,
                "note": "this invocation only",
            },
        )
        return results

    def _component_info(self) -> dict[str, Any]:
        """Model / judge / clusterer descriptions (``components.json``, written on first use)."""
        path = self.out / "components.json"
        info: dict[str, Any] = json.loads(path.read_text()) if path.exists() else {}
        info.setdefault("model", {"name": self.config.model})
        if self.config.judge:
            info.setdefault("judge", {"name": self.config.judge})
        if self.config.needs_clusters:
            info.setdefault("clusterer", {"name": self._clusterer_name})
        write_json_atomic(path, info)
        return info


def _fp_key(fp: dict[str, Any]) -> str:
    """The fingerprint's part of cache names: the model identity is guarded by fingerprint.json
    alone, so filling in a commit unknown at the first run keeps the caches."""
    return _hash({k: v for k, v in fp.items() if k != "model_identity"}, 16)


def _jsonable(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def _short(v: Any, n: int = 80) -> str:
    s = json.dumps(v, ensure_ascii=False, default=str)
    return s if len(s) <= n else s[: n - 3] + "..."


def run_evaluation(config: EvalConfig, **components: Any) -> dict[str, Any]:
    """Run ``config`` and return the results dictionary (also written to ``output_path``)."""
    return Evaluator(config, **components).run()
