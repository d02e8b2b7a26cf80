"""More replicas than the cluster can place are refused at once, in one line naming the resource,
instead of a silent wait for replicas Ray can never start (the nodes' resources are injected here;
test_distributed.py checks the same on a real local Ray cluster)."""

from __future__ import annotations

import pytest

from gnll.distributed.cluster import Cluster, RayUnavailable, check_resources, placeable


def test_all_replicas_are_counted_not_one():
    with pytest.raises(RayUnavailable) as err:
        check_resources(Cluster(replicas=4), [{"CPU": 2.0}])
    assert str(err.value).startswith(
        "4 replicas x 1 CPU need 4 CPUs; the cluster has 2 (room for 2 replicas)"
    )
    assert "--replicas" in str(err.value) and "\n" not in str(err.value)
    check_resources(Cluster(replicas=2), [{"CPU": 2.0}])  # fits: nothing raised


@pytest.mark.parametrize(
    ("cluster", "nodes", "fits", "words"),
    [
        # two 1-CPU nodes hold no 2-CPU replica, though the cluster has 2 CPUs in all
        (Cluster(replicas=1, cpus_per_replica=2), [{"CPU": 1.0}, {"CPU": 1.0}], 0, "no node"),
        # 4 CPUs in all, but only one node holds a 2-CPU replica
        (
            Cluster(replicas=2, cpus_per_replica=2),
            [{"CPU": 2.0}, {"CPU": 1.0}, {"CPU": 1.0}],
            1,
            "runs on one node",
        ),
        (Cluster(replicas=2, cpus_per_replica=2), [{"CPU": 2.0}, {"CPU": 1.0}], 1, "has 3"),
        (Cluster(replicas=2, gpus_per_replica=1), [{"CPU": 8.0, "GPU": 1.0}], 1, "2 GPUs"),
    ],
)
def test_per_node_and_gpu_needs(cluster, nodes, fits, words):
    assert placeable(cluster, nodes) == fits
    with pytest.raises(RayUnavailable, match=words):
        check_resources(cluster, nodes)
