"""Issue 28 (second fidelity pass): per-dataset temperatures, the overall Average over every paper
metric, several judges, the clusterer in the table header, the presets' splits."""

from __future__ import annotations

import pytest
from test_eval_runner import FakeModel, cfg, make_data_dir

from gnll.evaluation.run.runner import Evaluator


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return make_data_dir(tmp_path_factory.mktemp("data"))


# ----------------------------------------------------------------- 28.6: temperature per dataset
def test_temperature_scope_dataset_shares_one_choice_between_short_and_long(data_dir, tmp_path):
    tasks = ["triviaqa_short", "triviaqa_long"]
    per_task = Evaluator(
        cfg(data_dir, tmp_path / "task", tasks=tasks, beams=0, correctness=["f1"]),
        model=FakeModel(),
    ).run()["tasks"]
    per_data = Evaluator(
        cfg(
            data_dir,
            tmp_path / "data",
            tasks=tasks,
            beams=0,
            correctness=["f1"],
            temperature_scope="dataset",
        ),
        model=FakeModel(),
    ).run()["tasks"]
    short, long = (per_data[t]["temperature"] for t in tasks)
    assert short["scope"] == "dataset" and short["pooled_tasks"] == tasks
    assert short["per_measure"] == long["per_measure"]
    # the choice is made on the mean of the two tasks' held-out AUROCs, per measure
    a, b = (per_task[t]["temperature"]["candidates"] for t in tasks)
    for key, row in short["candidates"].items():
        for m, v in row["auroc"].items():
            assert v == pytest.approx((a[key]["auroc"][m] + b[key]["auroc"][m]) / 2)
    for m, t in short["per_measure"].items():
        best = max(row["auroc"][m] for row in short["candidates"].values())
        assert short["candidates"][f"{t:g}"]["auroc"][m] == best
    assert per_task["triviaqa_short"]["temperature"]["scope"] == "task"


# ----------------------------------------------------------------- 28.5: the presets' splits
class _FakeSplit(list):
    def train_test_split(self, test_size, seed):
        _FakeHub.calls.append(("train_test_split", test_size, seed))
        k = round(len(self) * test_size)
        return {"train": _FakeSplit(self[k:]), "test": _FakeSplit(self[:k])}


class _FakeHub:
    """A stand-in for the `datasets` module: the hub ids the loaders ask for, with tiny contents."""

    calls: list = []

    @classmethod
    def load_dataset(cls, name, *args, **kw):
        cls.calls.append((name, args, kw))
        if name == "TimoImhof/TriviaQA-in-SQuAD-format":
            rows = [
                {"id": f"tq{i}", "question": f"What is {i} plus one?", "context": "",
                 "answers": {"text": [f"{i + 1}", f"{i + 1}"], "answer_start": [0, 0]}}
                for i in range(150)
            ]  # fmt: skip
            return {"unmodified": _FakeSplit(rows)}
        if name == "nq_open":
            val = [{"question": f"what is {i} plus one", "answer": [f"{i + 1}"]} for i in range(40)]
            train = [{"question": f"who is {i}", "answer": [f"p{i}"]} for i in range(130)]
            return {"validation": val, "train": train}
        if name == "ChilleD/SVAMP":
            def row(i):
                return {"ID": f"chal-{i}", "Body": f"Tom has {i} apples.",
                        "Question": "How many now?", "Answer": float(i + 1),
                        "Equation": f"( {i} + 1.0 )", "Type": "Addition"}  # fmt: skip

            return {"train": [row(i) for i in range(130)], "test": [row(i) for i in range(130, 160)]}
        raise AssertionError(name)


@pytest.fixture
def fake_hub(monkeypatch):
    from gnll.evaluation.data import datasets

    _FakeHub.calls = []
    monkeypatch.setattr(datasets, "_import_hf_datasets", lambda: _FakeHub)
    return _FakeHub


def test_reference_source_evaluates_the_reference_codes_splits(fake_hub):
    from gnll.evaluation.data.tasks import get_task

    tq = get_task("triviaqa_short").load(seed=0, source="reference")
    assert ("train_test_split", 0.2, 10) in fake_hub.calls  # Farquhar et al.'s split and seed
    assert tq.data_info["source"] == "reference"
    assert "TimoImhof/TriviaQA-in-SQuAD-format" in tq.data_info["hub_id"]
    ev = tq.split("eval", 1000)
    assert len(ev) == 30 and all(e.extra["split"] == "test" for e in ev)
    assert ev[0].answers == (str(int(ev[0].id[2:]) + 1),)  # de-duplicated gold answers
    assert len(tq.heldout_idx) == 100 and all(
        tq.examples[i].extra["split"] == "train" for i in tq.heldout_idx + tq.fewshot_idx
    )
    nq = get_task("nq_open_long").load(seed=0, source="reference")
    ev = nq.split("eval", 1000)  # all of validation; the pools from train
    assert [e.id for e in sorted(ev, key=lambda e: int(e.id))] == [str(i) for i in range(40)]
    assert all(nq.examples[i].id.startswith("train-") for i in nq.heldout_idx + nq.fewshot_idx)
    sv = get_task("svamp_short").load(seed=0, source="reference")
    assert sorted(e.id for e in sv.split("eval", 1000)) == sorted(f"chal-{i}" for i in range(130, 160))
    # the hub source keeps TriviaQA's unfiltered validation set
    fake_hub.calls = []
    with pytest.raises(AssertionError, match="trivia_qa"):
        get_task("triviaqa_short").load(seed=0, source="hub")


def test_presets_select_the_reference_splits_and_the_header_names_them():
    from gnll.evaluation.run.presets import PRESETS
    from gnll.evaluation.results.tables import render_table

    for name in ("paper-table1", "paper-table6", "paper-llama-8b"):
        assert PRESETS[name].settings["data_source"] == "reference"
        assert PRESETS[name].settings["temperature_scope"] == "dataset"
    res = {
        "model": "m",
        "config": {},
        "tasks": {
            "triviaqa_short": {
                "mode": "short", "n_eval": 3000, "n_eval_pool": 3094, "n_fewshot_pool": 20,
                "n_heldout_pool": 100, "metrics": {},
                "data": {"source": "reference", "hub_id": "TimoImhof/TriviaQA-in-SQuAD-format",
                         "eval_pool": "the source's test split"},
            }
        },
    }  # fmt: skip
    head = render_table([res]).split("## AUROC")[0]
    assert "triviaqa_short 3000 of 3,094" in head
    assert "TimoImhof/TriviaQA-in-SQuAD-format" in head and "the source's test split" in head
