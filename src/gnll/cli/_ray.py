"""The ``--engine ray`` side of ``gnll score`` and ``gnll eval``: the same job, run on Ray replicas."""

from __future__ import annotations

import warnings
from typing import Annotated, Any

import typer

from gnll.cli._errors import plain

__all__ = [
    "AddressOption",
    "CpusOption",
    "EngineOption",
    "GpusOption",
    "ReplicasOption",
    "cluster_of",
    "score_on_ray",
]

# The options both commands take, declared once so their spelling and help stay the same.
EngineOption = Annotated[
    str, typer.Option("--engine", help="local (this process) or ray (replicas on a Ray cluster).")
]
AddressOption = Annotated[
    str, typer.Option("--address", help="Ray cluster: auto, HOST:PORT, ray://HOST:PORT, local.")
]
ReplicasOption = Annotated[int, typer.Option("--replicas", help="Ray: model replicas.")]
CpusOption = Annotated[
    float, typer.Option("--cpus-per-replica", help="Ray: CPUs (torch threads) per replica.")
]
GpusOption = Annotated[float, typer.Option("--gpus-per-replica", help="Ray: GPUs per replica.")]


def cluster_of(address: str, replicas: int, cpus: float, gpus: float) -> Any:
    from gnll.distributed.cluster import Cluster

    return Cluster(address=address, replicas=replicas, cpus_per_replica=cpus, gpus_per_replica=gpus)


def score_on_ray(
    *,
    console: Any,
    cluster: Any,
    model: str,
    model_args: str | None,
    calibration: str | None,
    long: bool,
    **job: Any,
) -> Any:
    """Run ``gnll score`` on ``cluster``: ``job`` holds the :class:`~gnll.scoring.ScoreJob` fields
    that do not depend on the model (each replica adds its chat template for ``messages`` rows)."""
    from gnll.calibration import load_calibration
    from gnll.cli._args import model_kwargs
    from gnll.distributed.scoring import run_score_job
    from gnll.scoring import ScoreJob
    from gnll.scoring.stream import CALIBRATED_COLUMNS

    cal = None
    if calibration is not None:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cal = load_calibration(calibration, model=model)
        for w in caught:
            console.print(f"[yellow]warning:[/] {plain(w.message)}")
        if cal.meta.get("measure", "g-nll") not in CALIBRATED_COLUMNS:
            raise ValueError(
                f"{calibration} maps measure {cal.meta.get('measure')!r}; gnll score can apply "
                f"calibrations of {', '.join(CALIBRATED_COLUMNS)}"
            )
    spec = ScoreJob(long=long, calibrator=cal, **job)
    return run_score_job(spec, model, model_kwargs(model_args), cluster)
