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
