"""Connecting to Ray and starting model replicas, with one-line errors that say what to do.

Nothing here imports ``ray`` at module level: ``import gnll`` and the local engine never need it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

__all__ = ["Cluster", "RayUnavailable", "check_resources", "placeable", "require_ray"]


class RayUnavailable(ValueError):
    """Ray is missing, no cluster answers, or a replica cannot start: the message says what to do."""


def require_ray() -> Any:
    """The ``ray`` module, or a :class:`RayUnavailable` naming the extra to install."""
    try:
        import ray
    except ImportError:
        raise RayUnavailable(
            "the ray engine needs Ray: pip install 'gnll[ray]' (or use --engine local)"
        ) from None
    return ray


def connect(address: str | None = "auto") -> Any:
    """Join the cluster at ``address`` (``auto``, ``HOST:PORT``, ``ray://HOST:PORT``), once per process.

    ``None`` starts a private local cluster on this machine's cores. A process that already called
    ``ray.init`` (a notebook, the tests) keeps its connection.
    """
    ray = require_ray()
    if ray.is_initialized():
        return ray
    kwargs: dict[str, Any] = {
        "include_dashboard": False,
        "log_to_driver": False,
        "logging_level": "WARNING",
    }
    if address in (None, "", "local"):
        kwargs["address"] = "local"  # always a new private cluster, never one `ray start` runs
    else:
        kwargs["address"] = address
        _probe(address)
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as e:
        where = address or "a local cluster"
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise RayUnavailable(
            f"no Ray cluster at {where} ({first[:160]}): start one with `ray start --head` "
            "(and `ray start --address HEAD:6379` on the workers) or pass --address local"
        ) from None
    return ray


def _probe(address: str) -> None:
    """Fail in seconds when nothing listens at ``HOST:PORT`` (Ray itself retries for a minute)."""
    import socket

    hostport = address.removeprefix("ray://")
    host, sep, port = hostport.rpartition(":")
    if address == "auto" or not sep or not port.isdigit():
        return
    try:
        socket.create_connection((host or "127.0.0.1", int(port)), timeout=5).close()
    except OSError as e:
        raise RayUnavailable(
            f"no Ray cluster at {address} ({e.strerror or e}): start one with `ray start --head` "
            "(and `ray start --address HEAD:6379` on the workers) or pass --address local"
        ) from None


@dataclass(frozen=True)
class Cluster:
    """Where and how big the replicas are.

    Parameters
    ----------
    address:
        ``auto`` (the cluster ``ray start`` runs on this machine, or ``RAY_ADDRESS``),
        ``HOST:PORT`` / ``ray://HOST:PORT``, or ``local`` (a private cluster of this machine).
    replicas:
        Model replicas (Ray actors); each loads the model once.
    cpus_per_replica, gpus_per_replica:
        Resources each replica reserves; its torch threads follow ``cpus_per_replica``.
    """

    address: str | None = "auto"
    replicas: int = 1
    cpus_per_replica: float = 1.0
    gpus_per_replica: float = 0.0

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"--replicas must be >= 1, got {self.replicas}")
        if self.cpus_per_replica <= 0 or self.gpus_per_replica < 0:
            raise ValueError("--cpus_per_replica must be > 0 and --gpus_per_replica >= 0")

    @property
    def threads(self) -> int:
        return max(1, int(self.cpus_per_replica))

    def actor_options(self) -> dict[str, Any]:
        """Ray options of a replica: its resources, and restart-and-retry when it dies (a killed
        replica is replaced, reloads the model and redoes the call it was running)."""
        return {
            "num_cpus": self.cpus_per_replica,
            "num_gpus": self.gpus_per_replica,
            "max_restarts": -1,
            "max_task_retries": -1,
        }


def placeable(cluster: Cluster, nodes: list[dict[str, float]]) -> int:
    """How many replicas of ``cluster``'s size the ``nodes`` (each node's total resources, as
    ``ray.nodes()`` reports them) can hold at once: a replica runs on one node."""
    need = {"CPU": cluster.cpus_per_replica, "GPU": cluster.gpus_per_replica}
    fits = 0
    for node in nodes:
        per_node = [node.get(res, 0.0) / n for res, n in need.items() if n > 0]
        fits += int(min(per_node) + 1e-9) if per_node else cluster.replicas
    return fits


def check_resources(cluster: Cluster, nodes: list[dict[str, float]]) -> None:
    """Refuse, in one line naming the resource, replicas the cluster can never place all at once
    (Ray would otherwise wait for them in silence).

    >>> check_resources(Cluster(replicas=4), [{"CPU": 2.0}])
    Traceback (most recent call last):
    ...
    gnll.distributed.cluster.RayUnavailable: 4 replicas x 1 CPU need 4 CPUs; the cluster has 2 (room for 2 replicas): lower --replicas or --cpus_per_replica, or add nodes
    """
    fits = placeable(cluster, nodes)
    if fits >= cluster.replicas:
        return
    room = f"room for {fits} replica{'s' if fits != 1 else ''}"
    wanted = [
        (res, per, option)
        for res, per, option in (
            ("CPU", cluster.cpus_per_replica, "--cpus_per_replica"),
            ("GPU", cluster.gpus_per_replica, "--gpus_per_replica"),
        )
        if per > 0
    ]
    for res, per, option in wanted:
        biggest = max((node.get(res, 0.0) for node in nodes), default=0.0)
        if biggest < per:
            raise RayUnavailable(
                f"a replica needs {per:g} {res}{'s' if per != 1 else ''} and no node of the "
                f"cluster has that many (the largest has {biggest:g}): lower {option} or add a "
                "larger node"
            )
    for res, per, option in wanted:
        have = sum(node.get(res, 0.0) for node in nodes)
        total = cluster.replicas * per
        if have < total:
            raise RayUnavailable(
                f"{cluster.replicas} replicas x {per:g} {res} need {total:g} {res}s; the cluster "
                f"has {have:g} ({room}): lower --replicas or {option}, or add nodes"
            )
    res, per, option = wanted[0]
    raise RayUnavailable(
        f"{cluster.replicas} replicas x {per:g} {res} do not fit on the cluster's nodes ({room}; a "
        f"replica runs on one node): lower --replicas or {option}, or add nodes"
    )


def start_replicas(actor_class: Any, cluster: Cluster, *args: Any, timeout: float = 600.0) -> list:
    """Start ``cluster.replicas`` actors of ``actor_class`` and wait until each has loaded its model.

    A replica that cannot load the model raises in its constructor; that error comes back here as
    one line, before any row is read.
    """
    ray = connect(cluster.address)
    check_resources(cluster, [n["Resources"] for n in ray.nodes() if n.get("Alive")])
    remote = ray.remote(actor_class).options(**cluster.actor_options())
    actors = [remote.remote(*args) for _ in range(cluster.replicas)]
    t0 = time.monotonic()
    ready = [a.ready.remote() for a in actors]
    try:
        done, pending = ray.wait(ready, num_returns=len(ready), timeout=timeout)
        ray.get(done)
    except ray.exceptions.RayActorError as e:
        for a in actors:
            ray.kill(a)
        cause = getattr(e, "cause", None) or e
        text = str(cause).strip().splitlines()
        msg = next((t for t in reversed(text) if t.strip()), type(cause).__name__)
        raise RayUnavailable(f"a replica could not load the model: {msg.strip()[:300]}") from None
    if pending:
        for a in actors:
            ray.kill(a)
        raise RayUnavailable(
            f"{len(pending)} of {len(actors)} replicas did not start within "
            f"{time.monotonic() - t0:.0f} s: the cluster has room for them, but other work holds "
            "its resources (check `ray status`; lower --replicas or the resources per replica)"
        )
    return actors
