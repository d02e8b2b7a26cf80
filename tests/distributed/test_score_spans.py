"""``gnll.distributed.score(..., spans=...)``: the Ray Data scorer writes the span columns ``gnll
score --spans`` writes (one actor's step run here on an Arrow batch, without Ray)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest
from fakes import ToyModel

from gnll.distributed.scoring import ScoreBatches
from gnll.scoring import ScoreJob, run_score_job


@pytest.mark.parametrize("kind", ["sentence", "json"])
def test_ray_data_batches_carry_the_span_columns_of_gnll_score(tmp_path, kind):
    rows = [
        {"id": 0, "question": "Two facts?", "answer": "paris is big. lyon is small."},
        {"id": 1, "question": "As JSON?", "answer": '{"city": "paris"}'},
    ]
    src = tmp_path / "in.jsonl"
    src.write_text("".join(json.dumps(r) + "\n" for r in rows))
    job = ScoreJob(str(src), str(tmp_path / "out.jsonl"), "jsonl", "jsonl", None, spans=kind)
    run_score_job(ToyModel(), job)
    want = [json.loads(x) for x in (tmp_path / "out.jsonl").read_text().splitlines()]

    actor = ScoreBatches(ToyModel, None, {"spans": kind, "batch_size": None, "threads": 1})
    got = actor(pa.Table.from_pylist(rows)).to_pylist()
    for g, w in zip(got, want, strict=True):
        for name in ("spans", "spans_kind", "least_certain_span", "max_span_nll"):
            assert g[name] == w.get(name), (kind, name)
        assert g["spans_error"] == w.get("spans_error")
    assert got[0]["spans_kind"] == kind and got[1]["spans"]  # the JSON answer has spans either way
