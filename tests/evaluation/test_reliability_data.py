"""Issue 15, point 7: dataset rows are checked at load, and a damaged cache line is an error.

Every message names the file, the line and the field, so the user can fix the row.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gnll.evaluation.data.datasets import DataError, load_dataset, parse_svamp
from gnll.evaluation.data.records import arith
from gnll.evaluation.run.cache import CacheDamagedError, JsonlCache

TQ = "triviaqa/triviaqa_unfiltered_validation.jsonl"
NQ = "nq_open/NQ-open.dev.jsonl"
SV = "svamp/SVAMP.json"


def _jsonl(root: Path, rel: str, lines: list[str]) -> Path:
    p = root / rel
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return p


def _tq(**fields) -> str:
    rec = {"index": 1, "question": "Q?", "aliases": ["A"]} | fields
    return json.dumps(rec)


GOOD_TQ = json.dumps({"index": 0, "question": "Who?", "aliases": ["Him"]})


def _svamp(root: Path, rows: list, *, indent: int | None = 2) -> Path:
    p = root / SV
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(rows, indent=indent), encoding="utf-8")
    return p


def _sv(k: int, **fields) -> dict:
    rec = {
        "ID": f"chal-{k}",
        "Body": "Tom has 2 apples.",
        "Question": "How many?",
        "Equation": "( 1.0 + 1.0 )",
        "Answer": 2.0,
    }
    return rec | fields


def _error(dataset: str, root: Path) -> str:
    with pytest.raises(DataError) as err:
        load_dataset(dataset, data_dir=root)
    return str(err.value)


@pytest.mark.parametrize(
    ("row", "field", "hint"),
    [
        (_tq(aliases="Paris"), "aliases", "list of strings"),  # was split into 5 one-letter golds
        (_tq(aliases=[]), "aliases", "empty list"),  # was noticed only after generation
        (_tq(aliases=["A", ""]), "aliases[1]", "empty answer"),
        (_tq(aliases=["A", 3]), "aliases[1]", "must be a string"),
        (_tq(question=None), "question", "got null"),  # was an AttributeError
        (_tq(question=42), "question", "must be a string"),
        (_tq(index=[1]), "index", "id"),
        (json.dumps({"index": 3, "aliases": ["A"]}), "question", "missing field"),
    ],
)
def test_triviaqa_row_errors_name_file_line_and_field(tmp_path, row, field, hint):
    _jsonl(tmp_path, TQ, [GOOD_TQ, "", row])
    msg = _error("triviaqa", tmp_path)
    assert msg.startswith(f"{tmp_path / TQ}:3: ")
    assert repr(field) in msg or field in msg
    assert hint in msg


@pytest.mark.parametrize("row", ["[1, 2]", '"just a string"', "7", "null"])
def test_non_object_rows_are_errors_with_their_line(tmp_path, row):
    _jsonl(tmp_path, NQ, [json.dumps({"question": "q", "answer": ["a"]}), row])
    msg = _error("nq_open", tmp_path)
    assert msg.startswith(f"{tmp_path / NQ}:2: expected a JSON object")


def test_nq_answer_must_be_a_list(tmp_path):
    _jsonl(tmp_path, NQ, [json.dumps({"question": "q", "answer": "yes"})])
    msg = _error("nq_open", tmp_path)
    assert f"{NQ}:1: field 'answer' must be a list of strings" in msg


def test_invalid_json_names_line(tmp_path):
    _jsonl(tmp_path, TQ, [GOOD_TQ, GOOD_TQ.replace("}", ""), GOOD_TQ])
    assert f"{TQ}:2: not valid JSON" in _error("triviaqa", tmp_path)


def test_invalid_utf8_names_file_and_line(tmp_path):
    p = _jsonl(tmp_path, TQ, [GOOD_TQ, _tq(question="caf@")])
    p.write_bytes(p.read_bytes().replace(b"caf@", b"caf\xe9"))  # Latin-1, not UTF-8
    msg = _error("triviaqa", tmp_path)
    assert msg.startswith(f"{p}:2: not valid UTF-8")
    p = _svamp(tmp_path, [_sv(1), _sv(2, Body="caf@")])
    p.write_bytes(p.read_bytes().replace(b"caf@", b"caf\xe9"))
    assert _error("svamp", tmp_path).startswith(f"{p}:11: not valid UTF-8")  # its Body line


def test_duplicate_ids_name_both_lines(tmp_path):
    _jsonl(tmp_path, TQ, [GOOD_TQ, _tq(), _tq()])
    msg = _error("triviaqa", tmp_path)
    assert msg.startswith(f"{tmp_path / TQ}:3: duplicate id '1'") and f"{TQ}:2" in msg


@pytest.mark.parametrize(
    ("answer", "hint"),
    [
        ("NaN", "finite"),
        ("inf", "finite"),
        ("-Infinity", "finite"),
        ("seven", "number"),
        (None, "number"),
        (True, "number"),
    ],
)
def test_svamp_answer_must_be_a_finite_number(tmp_path, answer, hint):
    p = _svamp(tmp_path, [_sv(1), _sv(2, Answer=answer)])
    msg = _error("svamp", tmp_path)
    # the second element of the indented list starts on line 9
    assert msg.startswith(f"{p}:9: field 'Answer' must be a {hint}")


def test_svamp_nan_literal_is_refused(tmp_path):
    p = tmp_path / SV
    p.parent.mkdir(parents=True)
    p.write_text(json.dumps([_sv(1)])[:-1].replace("2.0", "NaN") + "]")
    assert _error("svamp", tmp_path).startswith(f"{p}:1: field 'Answer' must be a finite")


def test_svamp_non_object_element_and_null_question(tmp_path):
    p = _svamp(tmp_path, [_sv(1), "oops"])
    assert _error("svamp", tmp_path).startswith(f"{p}:9: expected a JSON object")
    p = _svamp(tmp_path, [_sv(1), _sv(2), _sv(3, Question=None)], indent=None)
    assert _error("svamp", tmp_path).startswith(f"{p}:1: field 'Question' must be a string")
    p.write_text("{}")
    assert "expected a JSON list" in _error("svamp", tmp_path)


def test_deep_svamp_equation_has_no_recursion_error(tmp_path):
    terms = 3000
    flat = " + ".join(["1.0"] * terms)
    nested = "(" * terms + "1.0" + " + 1.0 )" * terms
    p = _svamp(tmp_path, [_sv(1, Equation=flat, Answer=float(terms)), _sv(2, Equation=nested)])
    ex = parse_svamp(p)
    assert ex[0].extra["consistent"] is True
    assert ex[1].extra["consistent"] is False  # 3001 != 2
    assert arith(flat) == terms and arith(nested) == terms + 1


def test_arith_matches_python_on_valid_and_refuses_invalid():
    for expr in [
        "( 76.0 - 25.0 )",
        "2 - -3 * 4",
        "-(2 + 3) / 4",
        "1 - 2 - 3",
        "8 / 4 / 2",
        "((1))",
        "3 * (2 + 1) - 4 / 8",
    ]:
        assert arith(expr) == pytest.approx(eval(expr)), expr  # noqa: S307 (trusted literal)
    for expr in ["", "1 +", "(1", "1)", "2 3", "x + 1", "1 / 0", "()", "1 ** 2"]:
        assert arith(expr) is None, expr


# ------------------------------------------------------------------------------------ caches
def _cache_with_three(p: Path) -> None:
    c = JsonlCache(p, {"stage": "x"})
    c.append([{"k": ["eval", i], "id": str(i), "v": i} for i in range(3)])


@pytest.mark.parametrize(
    ("damage", "hint"),
    [
        (b'{"k": ["eval", 1], "id": "1", "v"\n', "not valid JSON"),
        (b'{"k": ["eval", 1], "id": "caf\xe9"}\n', "not valid UTF-8"),
        (b'{"id": "1"}\n', "not a record"),
        (b'{"k": ["eval", "one"]}\n', "not [split, position]"),
        (b"[1, 2]\n", "not a record"),
    ],
)
def test_damaged_cache_line_is_an_error_and_later_records_survive(tmp_path, damage, hint):
    p = tmp_path / "greedy-abc.jsonl"
    _cache_with_three(p)
    lines = p.read_bytes().splitlines(keepends=True)
    lines[2] = damage  # line 3 of the file: the second record
    p.write_bytes(b"".join(lines))
    before = p.read_bytes()
    with pytest.raises(CacheDamagedError) as err:
        JsonlCache(p, {"stage": "x"})
    assert str(err.value).startswith(f"{p}:3: damaged cache record (")
    assert hint in str(err.value)
    assert p.read_bytes() == before  # the record after it (line 4) is still there


def test_torn_last_record_is_still_cut_off(tmp_path):
    p = tmp_path / "c.jsonl"
    _cache_with_three(p)
    with p.open("ab") as fh:
        fh.write(b'{"k": ["eval", 3], "id": "3", "v')
    c = JsonlCache(p, {"stage": "x"})
    assert len(c) == 3 and not c.has(("eval", 3))


def test_foreign_first_line_is_an_error_not_deleted(tmp_path):
    p = tmp_path / "c.jsonl"
    p.write_text("my notes\nmore notes\n")
    with pytest.raises(CacheDamagedError, match=r"c.jsonl:1: not a gnll stage cache"):
        JsonlCache(p, {"stage": "x"})
    assert p.read_text() == "my notes\nmore notes\n"
