"""Loaders for the paper's three QA benchmarks, in their original file formats.

Where the questions come from (``source``):

- ``"embedded"`` -- the sample shipped inside gnll (:mod:`gnll.evaluation.data.embedded`): a few
  hundred questions of each benchmark, enough for the demo; the default when no file is given;
- ``"local"`` -- the full files, looked up in ``data_path`` (one file of the dataset's own format,
  ``--data_path``), else ``data_dir`` (a folder with ``triviaqa/``, ``svamp/`` and ``nq_open/``,
  ``--data_dir``), else ``$GNLL_DATA_DIR``; the default when any of them is given;
- ``"hub"`` / ``"reference"`` -- the Hugging Face hub (needs the ``datasets`` package:
  ``pip install gnll[hub]``, and network).

Example
-------
>>> from gnll.evaluation.data.datasets import DATASETS
>>> DATASETS["svamp"].relpath
'svamp/SVAMP.json'
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gnll._util import file_sha256
from gnll.evaluation.data.embedded import EMBEDDED_DIR
from gnll.evaluation.data.records import (
    DataError,
    Row,
    arith,
    finite_number_field,
    id_field,
    iter_json_array,
    iter_jsonl,
    optional_str_field,
    str_field,
    str_list_field,
)

__all__ = [
    "DATASETS",
    "DataError",
    "DatasetSpec",
    "Example",
    "SOURCES",
    "candidate_data_dirs",
    "detect_dataset",
    "load_dataset",
    "resolve_data_file",
    "resolve_source",
]

ENV_VAR = "GNLL_DATA_DIR"
#: Where questions can come from; ``"auto"`` is ``"local"`` when a file or folder is given (or
#: ``$GNLL_DATA_DIR`` is set), else ``"embedded"``.
SOURCES = ("auto", "embedded", "local", "hub", "reference")


@dataclass(frozen=True)
class Example:
    """One question with its gold answers.

    Attributes
    ----------
    id:
        Stable identifier (TriviaQA ``index``, SVAMP ``ID``, NQ-Open line number).
    question:
        The question text shown to the model.
    answers:
        Gold answers; for TriviaQA every alias, for SVAMP the number formatted without a trailing
        ``.0``.
    context:
        SVAMP's problem body (shown in a ``Context:`` line), else ``None``.
    numeric_answer:
        SVAMP's gold number, else ``None``.
    """

    id: str
    question: str
    answers: tuple[str, ...]
    context: str | None = None
    numeric_answer: float | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)


def format_number(value: float) -> str:
    """``51.0`` -> ``'51'``, ``2.5`` -> ``'2.5'`` (how a gold number is shown in prompts and F1)."""
    if float(value).is_integer():
        return str(int(value))
    return repr(float(value))


# --------------------------------------------------------------------------- local file parsers
def _unique_ids(rows: list[tuple[Row, Example]]) -> list[Example]:
    seen: dict[str, str] = {}
    for row, ex in rows:
        if ex.id in seen:
            raise DataError(f"{row.where}: duplicate id {ex.id!r} (first at {seen[ex.id]})")
        seen[ex.id] = row.where
    return [ex for _, ex in rows]


def _triviaqa_example(row: Row, i: int) -> Example:
    return Example(
        id=id_field(row, "index", str(i)),
        question=str_field(row, "question"),
        answers=str_list_field(row, "aliases"),
    )


def parse_triviaqa(path: Path) -> list[Example]:
    return _unique_ids([(r, _triviaqa_example(r, i)) for i, r in enumerate(iter_jsonl(path))])


def _svamp_example(row: Row) -> Example:
    ans = finite_number_field(row, "Answer")
    equation = optional_str_field(row, "Equation")
    eq = arith(equation) if equation is not None else None
    return Example(
        id=id_field(row, "ID"),
        question=str_field(row, "Question"),
        answers=(format_number(ans),),
        context=str_field(row, "Body"),
        numeric_answer=ans,
        extra={
            "equation": equation,
            "type": row.data.get("Type"),
            # chal-680's Answer (1) contradicts its Equation (5): never show it as an example
            "consistent": eq is None or abs(eq - ans) < 1e-6,
        },
    )


def parse_svamp(path: Path) -> list[Example]:
    return _unique_ids([(r, _svamp_example(r)) for r in iter_json_array(path)])


def _nq_question(q: str) -> str:
    # NQ-Open questions are lower-case search queries without a question mark; Farquhar et al.
    # append one.
    q = q.strip()
    return q if q.endswith("?") else q + "?"


def _nq_example(row: Row, i: int) -> Example:
    return Example(
        id=str(i),
        question=_nq_question(str_field(row, "question")),
        answers=str_list_field(row, "answer"),
    )


def parse_nq_open(path: Path) -> list[Example]:
    return [_nq_example(r, i) for i, r in enumerate(iter_jsonl(path))]


# --------------------------------------------------------------------------- the embedded sample
#: Each dataset's record -> Example (the id comes from the sample, which keeps the full file's).
_EXAMPLE_OF: dict[str, Callable[[Row], Example]] = {
    "triviaqa": lambda row: _triviaqa_example(row, 0),
    "svamp": _svamp_example,
    "nq_open": lambda row: _nq_example(row, 0),
}


def _embedded_example(dataset: str, row: Row) -> Example:
    wrapped = row.data
    pool = wrapped.get("pool")
    rank = wrapped.get("rank")
    if pool not in ("fewshot", "heldout", "eval") or not isinstance(rank, int):
        raise DataError(f"{row.where}: not a line of gnll's embedded sample (pool/rank)")
    record = wrapped.get("record")
    if not isinstance(record, dict):
        raise DataError(f"{row.where}: field 'record' must be an object")
    ex = _EXAMPLE_OF[dataset](Row(row.where, record))
    return replace(ex, id=id_field(row, "id"), extra={**ex.extra, "pool": pool, "pool_rank": rank})


def _load_embedded(dataset: str, spec: DatasetSpec) -> tuple[list[Example], dict[str, Any]]:
    path = EMBEDDED_DIR / f"{dataset}.jsonl"
    rows = [(r, _embedded_example(dataset, r)) for r in iter_jsonl(path)]
    examples = _unique_ids(rows)
    return examples, {
        "dataset": dataset,
        "source": "embedded",
        # the package's copy: no local path in results (it differs per machine)
        "file": f"gnll/evaluation/data/embedded/{path.name}",
        "sha256": file_sha256(path),
        "n": len(examples),
        "sample_of": f"{Path(spec.relpath).name} ({spec.size:,} questions)",
    }


# --------------------------------------------------------------------------- hub loaders (optional)
def _import_hf_datasets():
    try:
        import datasets as hf_datasets  # type: ignore[import-not-found]
    except ImportError as exc:
        raise ImportError(
            "loading from the Hugging Face hub needs the `datasets` package: "
            "pip install 'gnll[hub]'"
        ) from exc
    return hf_datasets


def _hub_triviaqa() -> list[Example]:
    ds = _import_hf_datasets().load_dataset("trivia_qa", "unfiltered.nocontext", split="validation")
    return [
        _triviaqa_example(
            Row(
                f"hub trivia_qa row {i}",
                {"question": r["question"], "aliases": r["answer"]["aliases"]},
            ),
            i,
        )
        for i, r in enumerate(ds)
    ]


def _hub_svamp() -> list[Example]:
    dd = _import_hf_datasets().load_dataset("ChilleD/SVAMP")
    examples = []
    for split in ("train", "test"):
        for i, r in enumerate(dd[split]):
            ex = _svamp_example(Row(f"hub ChilleD/SVAMP {split} row {i}", r))
            # the paper evaluates the 300-problem test split (gnll.evaluation.data.tasks uses the mark)
            ex.extra["split"] = split
            examples.append(ex)
    examples.sort(key=lambda e: int(e.id.split("-")[-1]))
    return examples


def _hub_nq_open() -> list[Example]:
    # The paper's "more than 3,600" NQ-Open questions are all of validation; as in the reference
    # code, the few-shot and held-out pools come from train (marked, like SVAMP's split).
    dd = _import_hf_datasets().load_dataset("nq_open")
    examples = []
    for split, mark, prefix in (("validation", "test", ""), ("train", "train", "train-")):
        for i, r in enumerate(dd[split]):
            ex = _nq_example(Row(f"hub nq_open {split} row {i}", r), i)
            examples.append(replace(ex, id=prefix + ex.id, extra={**ex.extra, "split": mark}))
    return examples


#: Farquhar et al.'s TriviaQA: a ``train_test_split(test_size=0.2, seed=10)`` (their default
#: ``--random_seed``) of this hub dataset's ``unmodified`` split; its test part is evaluated.
REFERENCE_TRIVIAQA = "TimoImhof/TriviaQA-in-SQuAD-format"
REFERENCE_SEED = 10


def _reference_triviaqa() -> list[Example]:
    ds = _import_hf_datasets().load_dataset(REFERENCE_TRIVIAQA)["unmodified"]
    parts = ds.train_test_split(test_size=0.2, seed=REFERENCE_SEED)
    examples = []
    for split in ("train", "test"):
        for i, r in enumerate(parts[split]):
            row = Row(f"hub {REFERENCE_TRIVIAQA} {split} row {i}", r)
            answers = tuple(dict.fromkeys(a for a in r["answers"]["text"] if a.strip()))
            if not answers:  # nothing to judge against
                continue
            examples.append(
                Example(
                    id=id_field(row, "id"),
                    question=str_field(row, "question"),
                    answers=answers,
                    extra={"split": split},
                )
            )
    return examples


@dataclass(frozen=True)
class DatasetSpec:
    """Where a dataset's original file lives under a data directory, and how to read it."""

    name: str
    relpath: str
    parse: Callable[[Path], list[Example]]
    hub: Callable[[], list[Example]]
    hub_id: str
    size: int
    #: The reference code's split from the hub (``--data_source reference``), if it differs from
    #: :attr:`hub`.
    reference: Callable[[], list[Example]] | None = None
    reference_id: str | None = None


DATASETS: dict[str, DatasetSpec] = {
    "triviaqa": DatasetSpec(
        "triviaqa",
        "triviaqa/triviaqa_unfiltered_validation.jsonl",
        parse_triviaqa,
        _hub_triviaqa,
        "trivia_qa (unfiltered.nocontext, validation)",
        11313,
        _reference_triviaqa,
        f"{REFERENCE_TRIVIAQA} (unmodified; test part of train_test_split(0.2, seed "
        f"{REFERENCE_SEED}))",
    ),
    "svamp": DatasetSpec(
        "svamp", "svamp/SVAMP.json", parse_svamp, _hub_svamp, "ChilleD/SVAMP", 1000
    ),
    "nq_open": DatasetSpec(
        "nq_open",
        "nq_open/NQ-open.dev.jsonl",
        parse_nq_open,
        _hub_nq_open,
        "nq_open (validation; pools from train)",
        3610,
    ),
}


def detect_dataset(path: str | Path) -> str:
    """Guess a file's dataset from its first record (``triviaqa``, ``svamp`` or ``nq_open``)."""
    path = Path(path)
    with path.open("rb") as fh:
        # Bad bytes are the parser's to report, with their line; here they only must not crash.
        head = fh.read(1 << 16).decode("utf-8", errors="replace").lstrip()
    if head.startswith("["):
        return "svamp"
    first = head.splitlines()[0] if head else ""
    try:
        rec = json.loads(first)
    except json.JSONDecodeError:
        rec = None
    if not isinstance(rec, dict):
        raise DataError(
            f"{path}:1: cannot tell the dataset format: expected a JSON list (SVAMP) or one JSON "
            "object per line (TriviaQA, NQ-Open)"
        )
    if "aliases" in rec:
        return "triviaqa"
    if "answer" in rec:
        return "nq_open"
    if "Body" in rec:
        return "svamp"
    raise DataError(f"{path}:1: unknown dataset format (fields {sorted(rec)})")


def candidate_data_dirs(data_dir: str | Path | None = None) -> list[Path]:
    """The data directory searched: ``data_dir``, else ``$GNLL_DATA_DIR``, else none.

    Only one place is looked at, so a typo is an error rather than a silent fall-back to some
    other copy.
    """
    if data_dir:
        return [Path(data_dir).expanduser()]
    if os.environ.get(ENV_VAR):
        return [Path(os.environ[ENV_VAR]).expanduser()]
    return []


def resolve_source(
    source: str = "auto",
    data_dir: str | Path | None = None,
    data_path: str | Path | None = None,
) -> str:
    """``"auto"`` -> ``"local"`` when a file or folder is given (or ``$GNLL_DATA_DIR`` is set), else
    ``"embedded"``; any other source is checked and returned.

    >>> resolve_source("auto", data_dir="/data")
    'local'
    >>> resolve_source("hub")
    'hub'
    """
    if source not in SOURCES:
        raise ValueError(f"data source must be one of {', '.join(SOURCES)}; got {source!r}")
    if source != "auto":
        return source
    return "local" if (data_path or candidate_data_dirs(data_dir)) else "embedded"


def resolve_data_file(
    dataset: str, data_dir: str | Path | None = None, data_path: str | Path | None = None
) -> Path:
    """Find the local file of ``dataset``; the error says which file was expected where."""
    spec = _spec(dataset)
    if data_path:
        p = Path(data_path).expanduser()
        if not p.is_file():
            raise FileNotFoundError(
                f"--data_path {p} does not exist (expected the {dataset} file {spec.relpath})"
            )
        fmt = detect_dataset(p)
        if fmt != dataset:
            raise ValueError(f"--data_path {p} holds {fmt} data, but the task needs {dataset}")
        return p
    searched = []
    for d in candidate_data_dirs(data_dir):
        p = d / spec.relpath
        if p.is_file():
            return p
        searched.append(str(p))
    where = f"looked for {searched[0]}" if searched else "no data directory was given"
    raise FileNotFoundError(
        f"no local copy of {dataset}: {where}. Give --data_dir DIR (or set ${ENV_VAR}) pointing "
        f"at a folder that holds '{spec.relpath}', --data_path FILE for a single file, "
        "--data_source embedded for the sample shipped with gnll, or --data_source hub to load "
        f"{spec.hub_id} from the Hugging Face hub (needs `pip install 'gnll[hub]'` and network)."
    )


def _spec(dataset: str) -> DatasetSpec:
    try:
        return DATASETS[dataset]
    except KeyError:
        raise KeyError(f"unknown dataset {dataset!r}; known: {sorted(DATASETS)}") from None


def load_dataset(
    dataset: str,
    *,
    data_dir: str | Path | None = None,
    data_path: str | Path | None = None,
    source: str = "auto",
) -> tuple[list[Example], dict[str, Any]]:
    """Load all examples of ``dataset`` and a provenance record (file, sha256, count).

    ``source`` (module docstring): ``"auto"``, ``"embedded"`` (the shipped sample; its examples
    carry their pool in ``extra["pool"]``), ``"local"`` (the full files), ``"hub"`` (Hugging Face
    ``datasets``: SVAMP's test split and NQ-Open's validation set marked as the evaluation pool,
    their train parts as the pools) or ``"reference"`` (the hub with Farquhar et al.'s TriviaQA
    split, the presets').

    >>> examples, info = load_dataset("svamp", source="embedded")
    >>> info["source"], info["n"], examples[0].extra["pool"] in ("fewshot", "heldout", "eval")
    ('embedded', 320, True)
    """
    spec = _spec(dataset)
    source = resolve_source(source, data_dir, data_path)
    if source == "embedded":
        if data_dir or data_path:
            raise ValueError(
                "--data_source embedded reads the sample shipped with gnll: drop --data_dir/"
                "--data_path (or choose --data_source local to read them)"
            )
        return _load_embedded(dataset, spec)
    if source in ("hub", "reference"):
        # "reference": the splits of Farquhar et al.'s code, where they differ from the hub's
        ref = source == "reference" and spec.reference is not None
        examples = spec.reference() if ref else spec.hub()
        return examples, {
            "dataset": dataset,
            "source": source,
            "hub_id": spec.reference_id if ref else spec.hub_id,
            "n": len(examples),
        }
    path = resolve_data_file(dataset, data_dir, data_path)
    examples = spec.parse(path)  # checks every row; ids are unique
    if not examples:
        raise DataError(f"{path}: no examples")
    info = {
        "dataset": dataset,
        "source": "local",
        "file": str(path.resolve()),
        "sha256": file_sha256(path),
        "n": len(examples),
    }
    return examples, info
