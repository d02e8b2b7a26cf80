"""``gnll score`` on Ray: a file through replicas (the CLI), or a Ray Dataset through an actor pool.

:func:`run_score_job` is the local engine's job (same reader, chunks, errors file, writer and
``--resume``) with each chunk scored on a replica; results are written in input order, so the
output is the local engine's, row for row. :func:`score` is the library form: a Ray Dataset in,
a Ray Dataset out (``map_batches`` with a callable class: each actor loads the model once), rows
that cannot be scored carrying an ``error`` column instead of failing their block.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from gnll.distributed.cluster import Cluster, connect, require_ray, start_replicas
from gnll.distributed.replicas import ModelSpec, ScoreReplica, load, set_threads
from gnll.scoring.rows import Row
from gnll.scoring.stream import ChunkResult, ScoreJob, ScoreSummary, build_score_job
from gnll.scoring.stream import run_score_job as run_local

__all__ = ["SCORE_COLUMNS", "ScoreBatches", "run_score_job", "score"]

#: Chunks in flight per replica: one computing, one queued (no replica waits for the driver).
IN_FLIGHT = 2


def run_score_job(
    job: ScoreJob, model: ModelSpec, model_args: dict[str, Any] | None, cluster: Cluster
) -> ScoreSummary:
    """Score ``job`` on ``cluster.replicas`` replicas: the local engine's output, row for row."""
    ray = require_ray()
    from ray.util import ActorPool

    actors = start_replicas(ScoreReplica, cluster, model, model_args, job, cluster.threads)
    pool = ActorPool(actors)

    def map_chunks(todo: Iterator[tuple[list[Row], int]]) -> Iterator[ChunkResult]:
        # In order, a bounded number ahead: memory holds a few chunks, and a killed driver
        # leaves an output that --resume continues from.
        submitted = 0
        for chunk, start in todo:
            pool.submit(lambda a, v: a.score_chunk.remote(*v), (chunk, start))
            submitted += 1
            if submitted >= IN_FLIGHT * len(actors):
                yield pool.get_next()
                submitted -= 1
        while pool.has_next():
            yield pool.get_next()

    try:
        return run_local(None, job, map_chunks=map_chunks)
    finally:
        for a in actors:
            ray.kill(a)


# ---------------------------------------------------------------------------- Ray Data


def _score_fields(options: dict[str, Any]) -> list[tuple[str, Any]]:
    import pyarrow as pa

    fields = [
        ("nll", pa.float64()),
        ("ln_nll", pa.float64()),
        ("num_tokens", pa.int64()),
        ("is_greedy", pa.bool_()),
        ("greedy_stops", pa.bool_()),
        ("boundary_merged", pa.bool_()),
    ]
    if options.get("logprobs"):
        fields += [("tokens", pa.list_(pa.string())), ("token_logprobs", pa.list_(pa.float64()))]
    if options.get("with_greedy"):
        fields += [("greedy_answer", pa.string()), ("g_nll", pa.float64())]
    if options.get("calibration") is not None:
        fields += [("p_correct", pa.float64()), ("abstain", pa.bool_())]
    if options.get("spans"):
        span = pa.struct(
            [
                ("path", pa.string()),
                ("text", pa.string()),
                ("start", pa.int64()),
                ("end", pa.int64()),
                ("nll", pa.float64()),
                ("num_tokens", pa.int64()),
                ("straddling", pa.int64()),
            ]
        )
        fields += [
            ("spans", pa.list_(span)),
            ("spans_kind", pa.string()),
            ("least_certain_span", pa.string()),
            ("max_span_nll", pa.float64()),
            ("unassigned_nll", pa.float64()),
            ("spans_error", pa.string()),
        ]
    return [*fields, ("error", pa.string())]


#: The columns :func:`score` adds to every row (``tokens``/``token_logprobs``, ``greedy_answer``/
#: ``g_nll`` and ``p_correct``/``abstain`` only when asked for), as ``gnll score`` writes them.
SCORE_COLUMNS = ("nll", "ln_nll", "num_tokens", "is_greedy", "greedy_stops", "boundary_merged")


class ScoreBatches:
    """Ray Data callable class: each actor loads the model once and scores Arrow batches."""

    def __init__(
        self, model: ModelSpec, model_args: dict[str, Any] | None, options: dict[str, Any]
    ) -> None:
        set_threads(options.get("threads"))
        self.model = load(model, model_args)
        job = build_score_job(
            model=self.model.name,
            calibration=options.get("calibration"),
            input="-",
            output="-",
            input_format="jsonl",
            output_format="jsonl",
            errors=None,
            long=bool(options.get("long")),
            raw_prompt=bool(options.get("raw_prompt")),
            verbatim=bool(options.get("verbatim")),
            logprobs=bool(options.get("logprobs")),
            with_greedy=bool(options.get("with_greedy")),
            max_new_tokens=options.get("max_new_tokens"),
            spans=options.get("spans"),
            batch_size=options.get("batch_size"),
            progress=False,
        )
        self.job = job.for_model(self.model)
        self.fields = _score_fields(options)

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        rows = batch.to_pylist()
        res = score_chunk_rows(self.model, self.job, rows)
        schema = pa.schema(
            [f for f in batch.schema if f.name not in dict(self.fields)]
            + [pa.field(n, t) for n, t in self.fields]
        )
        return pa.Table.from_pylist(res, schema=schema)


def score_chunk_rows(model: Any, job: ScoreJob, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every row of a batch, scored or with its ``error`` (the local errors file's wording)."""
    from gnll.scoring.stream import score_chunk

    res = score_chunk(model, job, [(i + 1, r, None) for i, r in enumerate(rows)])
    out: list[dict[str, Any] | None] = [None] * len(rows)
    for r in res.rows:
        line = r.pop("input_line")
        out[line - 1] = {**r, "error": None}
    for line, err, _ in res.errors:
        out[line - 1] = {**rows[line - 1], "error": err}
    return out  # type: ignore[return-value]


def score(
    dataset: Any,
    *,
    model: ModelSpec = "smollm2-135m-instruct",
    model_args: dict[str, Any] | None = None,
    replicas: int | tuple[int, int] = 1,
    cpus_per_replica: float = 1.0,
    gpus_per_replica: float = 0.0,
    batch_size: int = 256,
    calibration: Any = None,
    **options: Any,
) -> Any:
    """Score the ``answer`` of every row of a Ray Dataset (lazily: nothing runs until it is consumed).

    Parameters
    ----------
    dataset:
        A ``ray.data.Dataset`` with ``answer`` and one of ``question``, ``prompt`` or ``messages``
        (``ray.data.read_json`` / ``read_csv`` / ``read_parquet`` of a ``gnll score`` input).
    model, model_args:
        What each replica loads (:func:`gnll.load_model`), or a zero-argument factory of a model.
    replicas:
        Actors, each holding one model; a ``(min, max)`` pair lets Ray Data autoscale the pool.
    cpus_per_replica, gpus_per_replica:
        Resources per actor (torch threads follow the CPUs).
    batch_size:
        Rows per call of an actor (the chunk of the local engine).
    calibration:
        A ``calibration.json`` path or a loaded calibrator: adds ``p_correct`` and ``abstain``.
    **options:
        ``raw_prompt``, ``verbatim``, ``long``, ``logprobs``, ``with_greedy``, ``max_new_tokens``,
        ``spans`` (``"sentence"`` or ``"json"``: each answer's span NLLs, the columns ``spans``,
        ``spans_kind``, ``least_certain_span``, ``max_span_nll``, ``unassigned_nll`` and
        ``spans_error``): as the ``gnll score`` options of the same names.

    Returns
    -------
    ray.data.Dataset
        The input columns plus ``nll``, ``ln_nll``, ``num_tokens``, ``is_greedy``,
        ``greedy_stops``, ``boundary_merged`` (and the optional columns) and ``error``: ``None``
        for a scored row, the reason (as in ``gnll score``'s errors file) for a row that was not.
    """
    if not require_ray().is_initialized():
        connect(None)
    unknown = set(options) - {
        "raw_prompt",
        "verbatim",
        "long",
        "logprobs",
        "with_greedy",
        "max_new_tokens",
        "spans",
    }
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(sorted(unknown))}")
    opts = {
        **options,
        "calibration": calibration,
        "batch_size": None,
        "threads": max(1, int(cpus_per_replica)),
    }
    return dataset.map_batches(
        ScoreBatches,
        fn_constructor_kwargs={"model": model, "model_args": model_args, "options": opts},
        batch_size=batch_size,
        batch_format="pyarrow",
        concurrency=replicas,
        num_cpus=cpus_per_replica,
        num_gpus=gpus_per_replica or None,
    )
