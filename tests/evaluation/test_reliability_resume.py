"""Issue 15, point 5: exact resume when a multi-record append was cut short (a torn chunk).

A kill between the records of one chunk leaves some of its questions on disk and some not. The
regenerated ones must be those of an uninterrupted run: every (question, sample) is seeded from its
identity (not its position in a call or chunk), and a torn chunk is recomputed as a whole so that
batch-dependent float rounding is the same too.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from fakes import FakeModel, cfg

from gnll.evaluation.run.runner import Evaluator


def _tear(run: Path, stage: str, keep: int) -> int:
    """Cut every ``stage`` cache after ``keep`` records, as a kill mid-append would."""
    torn = 0
    for path in run.glob(f"tasks/*/cache/{stage}-*.jsonl"):
        lines = path.read_bytes().splitlines(keepends=True)
        torn += len(lines) - 1 - keep
        half = lines[1 + keep][: len(lines[1 + keep]) // 2]  # and half of the next record
        path.write_bytes(b"".join(lines[: 1 + keep]) + half)
    for name in ("samples.jsonl", "results.json", "table.md"):
        (run / name).unlink()
    return torn


def _resume(data_dir, src: Path, dst: Path, model, **kw) -> None:
    Evaluator(cfg(data_dir, dst, resume=True, **kw), model=model).run()


def test_torn_chunk_and_another_chunk_size_reproduce_the_samples(data_dir, tmp_path):
    opts = dict(tasks=["nq_open_short"], measures=["pe", "g-nll"], temperature=1.0, limit=12)
    ref = tmp_path / "ref"
    Evaluator(cfg(data_dir, ref, chunk_size=12, **opts), model=FakeModel()).run()
    for chunk_size in (12, 5):  # the same chunks, then different ones on resume
        run = tmp_path / f"torn{chunk_size}"
        shutil.copytree(ref, run)
        assert _tear(run, "samples-t1", keep=3) == 9
        _resume(data_dir, ref, run, FakeModel(), chunk_size=chunk_size, **opts)
        assert (run / "samples.jsonl").read_bytes() == (ref / "samples.jsonl").read_bytes()
        [cache] = run.glob("tasks/*/cache/samples-t1-*.jsonl")
        assert len(cache.read_text().splitlines()) == 1 + 12  # no record appended twice


@pytest.mark.model
def test_torn_chunk_on_the_real_backend_reproduces_the_samples(data_dir, tmp_path, smollm):
    opts = dict(
        tasks=["nq_open_short"], measures=["pe", "g-nll"], temperature=1.0, limit=4, samples=3
    )
    ref = tmp_path / "ref"
    Evaluator(cfg(data_dir, ref, chunk_size=4, **opts), model=smollm).run()
    run = tmp_path / "torn"
    shutil.copytree(ref, run)
    assert _tear(run, "samples-t1", keep=1) == 3  # one chunk of 4: 1 record kept, 3 lost
    _resume(data_dir, ref, run, smollm, chunk_size=4, **opts)
    assert (run / "samples.jsonl").read_bytes() == (ref / "samples.jsonl").read_bytes()


def test_resume_with_a_larger_limit_computes_only_the_new_questions(data_dir, tmp_path):
    """A finished --limit 8 run resumed with --limit 16 asks the model 8 new questions, not 16: its
    chunk was whole on disk (no torn append), so nothing of it is recomputed."""
    opts = dict(tasks=["nq_open_short"], measures=["pe", "g-nll"], temperature=1.0, chunk_size=256)
    run = tmp_path / "grow"
    Evaluator(cfg(data_dir, run, limit=8, **opts), model=FakeModel()).run()
    model = FakeModel()
    Evaluator(cfg(data_dir, run, limit=16, resume=True, **opts), model=model).run()
    assert model.calls["greedy"] == 8
    assert model.calls["sample"] == 8  # prompts sampled: the new questions only
    ref = tmp_path / "ref"
    Evaluator(cfg(data_dir, ref, limit=16, **opts), model=FakeModel()).run()
    assert (run / "samples.jsonl").read_bytes() == (ref / "samples.jsonl").read_bytes()
