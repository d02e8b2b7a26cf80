"""The runner's one engine seam: a chunk mapper that computes the stages' work somewhere else.

The works cross a pickle round trip (as they cross to a Ray replica) and are computed with
another process's components; the driver, whose ``load_model`` raises, loads nothing, and its run
directory is the local run's, byte for byte.
"""

from __future__ import annotations

import json
import pickle

from fakes import FakeJudge, FakeModel, cfg

from gnll.evaluation.run.runner import Evaluator


def _no_loading(*args, **kwargs):
    raise AssertionError(f"the driver must load no model: load_model{args} was called")


def test_a_mapper_computing_elsewhere_gives_the_local_run_and_the_driver_loads_nothing(
    data_dir, tmp_path, monkeypatch
):
    options = dict(judge="fake-judge", correctness=["judge", "f1"])
    Evaluator(
        cfg(data_dir, tmp_path / "local", **options), model=FakeModel(), judge=FakeJudge()
    ).run()

    # The "replica": components of the same configuration, in their own scratch directory.
    elsewhere = Evaluator(
        cfg(data_dir, tmp_path / "scratch", **options), model=FakeModel(), judge=FakeJudge()
    )
    sizes = []

    def mapper(works):
        sizes.append(len(works))
        for work in works:
            result = pickle.loads(pickle.dumps(work)).run(elsewhere)
            yield pickle.loads(pickle.dumps(result))

    monkeypatch.setattr("gnll.backends.load_model", _no_loading)
    driver = Evaluator(
        cfg(data_dir, tmp_path / "mapped", **options), map_works=mapper, chunks_per_wave=None
    )
    driver.run()
    for name in ("samples.jsonl", "results.json", "table.md"):
        assert (tmp_path / "mapped" / name).read_bytes() == (tmp_path / "local" / name).read_bytes()
    # chunks_per_wave=None: a split's chunks (24 eval questions, chunks of 8) go out together
    assert max(sizes) == 3
    components = json.loads((tmp_path / "mapped" / "components.json").read_text())
    assert components["judge"]["name"] == "fake-lm" and components["model"]["name"] == "fake-lm"
    assert components["clusterer"]["clusterer"] == "exact"


def test_a_replica_clusters_with_the_clusterer_the_driver_resolved_auto_to(
    data_dir, tmp_path, monkeypatch
):
    """``auto`` is resolved once, on the driver: its cache header records the name, and each
    ClusterWork carries it, so a replica whose own resolution differs (another node, other
    models on disk) clusters with the driver's, not its own."""
    import gnll.semantic

    monkeypatch.setattr(gnll.semantic, "resolve_clusterer_name", lambda name: "exact")
    driver_cfg = cfg(data_dir, tmp_path / "mapped", clusterer="auto")
    Evaluator(cfg(data_dir, tmp_path / "local", clusterer="exact"), model=FakeModel()).run()
    # the replica's node would pick another clusterer (one that cannot even load here)
    monkeypatch.setattr(gnll.semantic, "resolve_clusterer_name", lambda name: "no-such-clusterer")
    elsewhere = Evaluator(cfg(data_dir, tmp_path / "scratch", clusterer="auto"), model=FakeModel())
    assert elsewhere._clusterer_name == "no-such-clusterer"

    def mapper(works):
        for work in works:
            yield pickle.loads(pickle.dumps(pickle.loads(pickle.dumps(work)).run(elsewhere)))

    monkeypatch.setattr(gnll.semantic, "resolve_clusterer_name", lambda name: "exact")
    driver = Evaluator(driver_cfg, map_works=mapper)
    monkeypatch.setattr("gnll.backends.load_model", _no_loading)
    driver.run()
    assert elsewhere.clusterer.info()["clusterer"] == "exact"
    local = tmp_path / "local" / "samples.jsonl"
    assert (tmp_path / "mapped" / "samples.jsonl").read_bytes() == local.read_bytes()
