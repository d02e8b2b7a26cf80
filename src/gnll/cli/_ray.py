"""The ``--engine ray`` side of ``gnll score`` and ``gnll eval``: the same job, run on Ray replicas."""

from __future__ import annotations

from typing import Annotated, Any

import typer

__all__ = [
    "AddressOption",
    "CpusOption",
    "EngineOption",
    "GpusOption",
    "ReplicasOption",
    "cluster_of",
]

# The options both commands take, declared once so their spelling and help stay the same.
EngineOption = Annotated[
    str,
    typer.Option(
        "--engine",
        rich_help_panel="Engine",
        help="local (this process) or ray (replicas on a Ray cluster).",
    ),
]
AddressOption = Annotated[
    str,
    typer.Option(
        "--address",
        rich_help_panel="Engine",
        help="Ray cluster: auto, HOST:PORT, ray://HOST:PORT, local.",
    ),
]
ReplicasOption = Annotated[
    int, typer.Option("--replicas", rich_help_panel="Engine", help="Ray: model replicas.")
]
CpusOption = Annotated[
    float,
    typer.Option(
        "--cpus-per-replica",
        rich_help_panel="Engine",
        help="Ray: CPUs (torch threads) per replica.",
    ),
]
GpusOption = Annotated[
    float,
    typer.Option("--gpus-per-replica", rich_help_panel="Engine", help="Ray: GPUs per replica."),
]


def cluster_of(address: str, replicas: int, cpus: float, gpus: float) -> Any:
    from gnll.distributed.cluster import Cluster

    return Cluster(address=address, replicas=replicas, cpus_per_replica=cpus, gpus_per_replica=gpus)
