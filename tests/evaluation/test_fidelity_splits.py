"""Evaluation pools: split files, a separate few-shot/held-out pool file, SVAMP's fixed subset."""

from __future__ import annotations

import json

import pytest

from gnll.evaluation.data import tasks as T
from gnll.evaluation.data.datasets import Example


def _nq(path, n, prefix="q"):
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as fh:
        for k in range(n):
            fh.write(json.dumps({"question": f"{prefix} {k}", "answer": [f"a{k}"]}) + "\n")
    return path


def _svamp(path, n):
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            "ID": f"chal-{k + 1}",
            "Body": f"Tom has {k} apples.",
            "Question": "How many?",
            "Equation": f"( {k}.0 + 0.0 )",
            "Answer": float(k),
            "Type": "Addition",
        }
        for k in range(n)
    ]
    path.write_text(json.dumps(rows))
    return path


def test_pool_file_makes_the_whole_data_file_the_evaluation_pool(tmp_path):
    """NQ-Open: all 3,610 dev questions evaluated, few-shot and held-out from a train file."""
    dev = _nq(tmp_path / "data" / "nq_open" / "NQ-open.dev.jsonl", 3610)
    train = _nq(tmp_path / "train.jsonl", 500, prefix="train")
    td = T.get_task("nq_open_short").load(data_path=dev, pool_path=train)
    d = td.describe()
    assert (d["n_eval_pool"], d["n_fewshot_pool"], d["n_heldout_pool"]) == (3610, 20, 100)
    eval_ids = {td.examples[i].id for i in td.eval_idx}
    assert not any(i.startswith("pool:") for i in eval_ids)
    assert all(e.id.startswith("pool:") for e in td.fewshot)
    assert all(td.examples[i].id.startswith("pool:") for i in td.heldout_idx)
    assert "train.jsonl" in d["data"]["eval_pool"]
    # without the pool file, 120 dev questions go to the pools
    assert T.get_task("nq_open_short").load(data_path=dev).describe()["n_eval_pool"] == 3490


def test_split_file_lists_the_evaluation_pool_and_names_bad_lines(tmp_path):
    data = _svamp(tmp_path / "svamp" / "SVAMP.json", 400)
    split = tmp_path / "test_ids.txt"
    split.write_text("# a test split\n" + "\n".join(f"chal-{k}" for k in range(1, 151)) + "\n\n")
    td = T.get_task("svamp_short").load(data_path=data, split_path=f"svamp={split}")
    assert sorted(int(td.examples[i].id.split("-")[1]) for i in td.eval_idx) == list(range(1, 151))
    outside = {td.examples[i].id for i in td.heldout_idx} | {e.id for e in td.fewshot}
    assert not outside & {td.examples[i].id for i in td.eval_idx}
    # a split file for another dataset leaves this one alone
    other = T.get_task("svamp_short").load(data_path=data, split_path=f"nq_open={split}")
    assert other.describe()["n_eval_pool"] == 400 - 120
    split.write_text("chal-1\nchal-9999\n")
    with pytest.raises(ValueError, match=r"test_ids.txt:2: id 'chal-9999'"):
        T.get_task("svamp_short").load(data_path=data, split_path=split)
    with pytest.raises(ValueError, match="DATASET=PATH"):
        T.path_for("svamp=a,bogus=b", "svamp")


def test_svamp_original_file_evaluates_a_fixed_300_subset_for_every_seed(tmp_path):
    data = _svamp(tmp_path / "svamp" / "SVAMP.json", 1000)
    a = T.get_task("svamp_short").load(data_path=data, seed=0)
    b = T.get_task("svamp_short").load(data_path=data, seed=1)
    ids = lambda td: {td.examples[i].id for i in td.eval_idx}  # noqa: E731
    assert len(ids(a)) == 300 and ids(a) == ids(b)
    assert a.describe()["n_fewshot_pool"] == 20 and a.describe()["n_heldout_pool"] == 100
    assert not ids(a) & {a.examples[i].id for i in a.heldout_idx}
    assert a.eval_idx != b.eval_idx  # the order (what --limit takes) still follows --seed
    # a file of another size (not the original) is split as before
    small = _svamp(tmp_path / "small" / "SVAMP.json", 200)
    assert T.get_task("svamp_short").load(data_path=small).describe()["n_eval_pool"] == 80


def test_a_sources_test_split_is_the_evaluation_pool(monkeypatch):
    """SVAMP from the hub carries ChilleD's train/test marks: the 300 test problems are evaluated."""
    exs = [
        Example(
            f"chal-{k}",
            "How many?",
            (str(k),),
            "Body.",
            float(k),
            extra={"split": "test" if k % 10 < 3 else "train"},
        )
        for k in range(1000)
    ]
    monkeypatch.setattr(T, "load_dataset", lambda *a, **k: (list(exs), {"source": "hub"}))
    td = T.get_task("svamp_short").load(source="hub")
    assert len(td.eval_idx) == 300
    assert all(td.examples[i].extra["split"] == "test" for i in td.eval_idx)
    assert all(td.examples[i].extra["split"] == "train" for i in td.heldout_idx)


def test_table_header_prints_pool_sizes(tmp_path):
    from gnll.evaluation.results.tables import render_table

    res = {
        "model": "m",
        "config": {},
        "tasks": {
            "svamp_short": {
                "mode": "short",
                "n_eval": 200,
                "n_eval_pool": 300,
                "n_fewshot_pool": 20,
                "n_heldout_pool": 100,
                "correctness": ["f1"],
                "metrics": {},
            }
        },
    }
    assert "svamp_short 200 of 300 (few-shot pool 20, held-out pool 100)" in render_table([res])
