"""Dataset loaders, the seeded split, prompt construction (golden strings) and the stage cache."""

from __future__ import annotations

import json

import pytest
from full_data import FULL_DATA, needs_full_data

from gnll.evaluation.data.datasets import (
    DATASETS,
    Example,
    detect_dataset,
    load_dataset,
    resolve_data_file,
)
from gnll.evaluation.data.prompts import (
    BRIEF_LONG,
    BRIEF_SHORT,
    build_prompt,
    canonical_answer,
    judge_prompt,
    rank_aliases,
)
from gnll.evaluation.data.tasks import TASKS, get_task, parse_task_list, split_indices
from gnll.evaluation.run.cache import CacheMismatchError, JsonlCache


# ------------------------------------------------------------------------------------ prompts
def test_golden_short_prompt():
    fewshot = [
        Example("1", "Who wrote Hamlet?", ("Shakespeare",)),
        Example("2", "Capital of France?", ("Paris",)),
    ]
    got = build_prompt(BRIEF_SHORT, fewshot, Example("3", "Largest planet?", ("Jupiter",)))
    assert got == (
        "Answer the following question as briefly as possible.\n"
        "Question: Who wrote Hamlet?\nAnswer: Shakespeare\n\n"
        "Question: Capital of France?\nAnswer: Paris\n\n"
        "Question: Largest planet?\nAnswer:"
    )


def test_golden_long_svamp_prompt():
    ex = Example(
        "chal-1", "How much?", ("51",), context="Each pack costs 76 dollars.", numeric_answer=51.0
    )
    assert build_prompt(BRIEF_LONG, [], ex) == (
        "Answer the following question in a single brief but complete sentence.\n"
        "Context: Each pack costs 76 dollars.\nQuestion: How much?\nAnswer:"
    )


def test_golden_judge_prompts():
    single = judge_prompt("Who wrote Hamlet?", ["Shakespeare"], "William Shakespeare")
    assert single == (
        "We are assessing the quality of answers to the following question: Who wrote Hamlet?\n"
        "The expected answer is: Shakespeare.\n"
        "The proposed answer is: William Shakespeare\n"
        "Within the context of the question, does the proposed answer mean the same as the "
        "expected answer? Respond only with yes or no.\nResponse:"
    )
    multi = judge_prompt(
        "Q?", ["Sunset Blvd", "Sunset Blvd.", "Sunset Boulevard"], "Sunset Boulevard"
    )
    assert (
        "The following are expected answers to this question: ['Sunset Blvd', 'Sunset Boulevard']."
        in multi
    )
    assert (
        "mean the same as any of the expected answers? Respond only with yes or no.\nResponse:"
        in multi
    )
    many = judge_prompt("Q?", [f"alias {i}" for i in range(50)], "x")
    assert many.count("alias") == 10


def test_canonical_answer_skips_redirect_titles():
    aliases = [
        "The Bill Bailey trilogy",
        "Tilly Trotter",
        "Dame Catherine Cookson",
        "Catherine Cookson",
        "Catherine Marchant",
        "Katie McMullen",
        "Catherine Ann McMullen",
    ]
    assert canonical_answer(aliases) == "Catherine Cookson"
    assert canonical_answer(["Scorpio", "Skorpio", "Scorpio (disambiguation)"]) == "Scorpio"
    assert rank_aliases(["x"]) == ["x"]


@pytest.mark.parametrize("name", sorted(TASKS))
def test_task_prompts_on_real_data(name):
    task = get_task(name)
    td = task.load(seed=0)  # the embedded sample
    ex = td.split("eval", 1)[0]
    prompt = td.prompt(ex)
    if task.mode == "short":
        assert prompt.startswith(
            BRIEF_SHORT + "\nQuestion: " if task.dataset != "svamp" else BRIEF_SHORT + "\nContext: "
        )
        assert prompt.count("Question: ") == 6 and prompt.count("\nAnswer: ") == 5
    else:
        assert prompt.startswith(BRIEF_LONG + "\n") and prompt.count("Question: ") == 1
    assert prompt.endswith(f"Question: {ex.question}\nAnswer:")
    if task.dataset == "svamp":
        assert f"Context: {ex.context}\nQuestion: " in prompt
    # few-shot examples never come from the held-out or evaluation pools
    pools = {td.examples[i].id for i in td.heldout_idx + td.eval_idx}
    assert not {e.id for e in td.fewshot} & pools


@needs_full_data
def test_golden_real_prompt_svamp_short():
    td = get_task("svamp_short").load(seed=0, data_dir=str(FULL_DATA))
    # the few-shot examples come from the 700 problems outside the fixed 300-problem evaluation pool
    assert td.prefix.startswith(
        "Answer the following question as briefly as possible.\n"
        "Context: Danny collects bottle caps and wrappers. He found 46 wrappers and 50 bottle caps "
        "at the park."
    )
    assert td.prefix.endswith(
        "Context: Rachel picked 3 ripe apples from her tree. Now the tree has 2 ripe apples and 27 "
        "unripe apples.\nQuestion: How many ripe apples did the tree have to begin with?\n"
        "Answer: 5\n\n"
    )
    assert len(td.eval_idx) == 300
    # chal-680 is in the few-shot pool, but its gold answer contradicts its equation
    pool = [td.examples[i].id for i in range(len(td.examples))]
    assert "chal-680" in pool and "chal-680" not in [e.id for e in td.fewshot]


def test_golden_real_prompt_triviaqa_short():
    td = get_task("triviaqa_short").load(seed=0)  # the embedded sample keeps the full file's split
    assert [e.id for e in td.fewshot] == ["1371", "9530", "10382", "10517", "10661"]
    assert td.prefix.count("\nAnswer: ") == 5 and td.prefix.endswith("\n\n")


# ------------------------------------------------------------------------------------ splits
def test_split_is_seeded_disjoint_and_complete():
    a = split_indices(500, 0)
    assert a == split_indices(500, 0)
    assert a != split_indices(500, 1)
    fs, ho, ev = a
    assert len(fs) == 20 and len(ho) == 100 and len(ev) == 380
    assert sorted(fs + ho + ev) == list(range(500))
    with pytest.raises(ValueError):
        split_indices(100, 0)


def test_short_and_long_tasks_share_questions(tmp_path):
    from fakes import make_data_dir

    d = make_data_dir(tmp_path / "d")
    s = get_task("nq_open_short").load(data_dir=d).split("eval", 5)
    long_ = get_task("nq_open_long").load(data_dir=d).split("eval", 5)
    assert [e.id for e in s] == [e.id for e in long_]


def test_parse_task_list():
    assert [t.name for t in parse_task_list("svamp_short, svamp_short")] == ["svamp_short"]
    assert len(parse_task_list("all")) == 6
    assert {t.mode for t in parse_task_list("long")} == {"long"}
    with pytest.raises(KeyError, match="unknown task"):
        parse_task_list("squad")


# ------------------------------------------------------------------------------------ loaders
def test_loaders_read_original_formats(tmp_path):
    from fakes import make_data_dir

    d = make_data_dir(tmp_path / "d")
    tq, info = load_dataset("triviaqa", data_dir=d)
    assert tq[3].id == "3" and tq[3].answers == ("n4", "num 4") and info["sha256"]
    sv, _ = load_dataset("svamp", data_dir=d)
    assert (
        sv[0].context.startswith("Tom has")
        and sv[0].answers == ("1",)
        and sv[0].numeric_answer == 1.0
    )
    nq, _ = load_dataset("nq_open", data_dir=d)
    assert nq[0].question == "what is 0 plus one?"  # question mark appended as in Farquhar et al.
    for name in DATASETS:
        assert detect_dataset(d / DATASETS[name].relpath) == name
    # --data_path takes a single file, and checks it holds the right dataset
    assert resolve_data_file("svamp", data_path=d / "svamp" / "SVAMP.json").name == "SVAMP.json"
    with pytest.raises(ValueError, match="holds svamp"):
        resolve_data_file("nq_open", data_path=d / "svamp" / "SVAMP.json")


def test_missing_data_error_names_file_and_places(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("GNLL_DATA_DIR", str(tmp_path / "env"))
    with pytest.raises(FileNotFoundError) as err:
        load_dataset("nq_open", data_dir=tmp_path / "given")
    msg = str(err.value)
    assert "nq_open/NQ-open.dev.jsonl" in msg
    assert str(tmp_path / "given") in msg and "--data_dir" in msg and "--data_source hub" in msg
    assert "--data_source embedded" in msg
    with pytest.raises(FileNotFoundError, match="env"):
        load_dataset("nq_open")  # $GNLL_DATA_DIR is used when no --data_dir is given
    monkeypatch.delenv("GNLL_DATA_DIR")
    with pytest.raises(FileNotFoundError, match="no data directory was given"):
        load_dataset("nq_open", source="local")
    # nothing given at all: the embedded sample, never a folder guessed from the working directory
    (tmp_path.parent / "shared" / "data").mkdir(parents=True, exist_ok=True)
    assert load_dataset("nq_open")[1]["source"] == "embedded"


@needs_full_data
def test_real_data_counts():
    for name, spec in DATASETS.items():
        examples, _ = load_dataset(name, data_dir=FULL_DATA)
        assert len(examples) == spec.size


# ------------------------------------------------------------------------------------ cache
def test_cache_survives_torn_write_and_checks_header(tmp_path):
    p = tmp_path / "c.jsonl"
    c = JsonlCache(p, {"stage": "x"})
    c.append([{"k": ["eval", 0], "id": "a", "v": 1}, {"k": ["eval", 1], "id": "b", "v": 2}])
    with p.open("a") as fh:
        fh.write('{"k": ["eval", 2], "id": "c", "v"')  # killed mid-write
    c2 = JsonlCache(p, {"stage": "x"})
    assert len(c2) == 2 and not c2.has(("eval", 2))
    c2.append([{"k": ["eval", 2], "id": "c", "v": 3}])
    assert JsonlCache(p, {"stage": "x"}).get(("eval", 2))["v"] == 3
    assert [json.loads(x).get("id") for x in p.read_text().splitlines()[1:]] == ["a", "b", "c"]
    with pytest.raises(CacheMismatchError):
        JsonlCache(p, {"stage": "y"})


def test_hub_loaders_map_fields(monkeypatch):
    """The optional Hugging Face path, with a stand-in `datasets` module (no network)."""
    import sys
    import types

    def fake_load_dataset(name, config=None, split=None):
        if name == "trivia_qa":
            return [{"question": "Q1 ", "answer": {"aliases": ["A", "B"], "value": "A"}}]
        if name == "nq_open":  # validation is the evaluation pool, train the few-shot pool
            return {
                "validation": [{"question": "who is it", "answer": ["him"]}],
                "train": [{"question": "who was it", "answer": ["her"]}],
            }
        if name == "ChilleD/SVAMP":
            row = {"ID": "chal-2", "Body": "B.", "Question": "Q?", "Answer": 3.0}
            return {"train": [row], "test": [{**row, "ID": "chal-1", "Answer": 2.5}]}
        raise AssertionError(name)

    monkeypatch.setitem(
        sys.modules, "datasets", types.SimpleNamespace(load_dataset=fake_load_dataset)
    )
    tq, info = load_dataset("triviaqa", source="hub")
    assert tq[0].question == "Q1" and tq[0].answers == ("A", "B") and info["source"] == "hub"
    nq, _ = load_dataset("nq_open", source="hub")
    assert [e.question for e in nq] == ["who is it?", "who was it?"]
    assert [e.extra["split"] for e in nq] == ["test", "train"] and nq[1].id.startswith("train-")
    sv, _ = load_dataset("svamp", source="hub")
    assert [e.id for e in sv] == ["chal-1", "chal-2"] and sv[0].answers == ("2.5",)
