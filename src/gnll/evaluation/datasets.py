"""Loaders for the paper's three QA benchmarks, in their original file formats.

The files are never part of the repository. They are looked up, in this order, in

1. ``data_path`` -- one file of the dataset's own format (``--data_path``), else
2. ``data_dir`` -- a folder laid out like ``shared/data`` (``--data_dir``), else
3. ``$GNLL_DATA_DIR``, else
4. ``../shared/data`` relative to the working directory, then relative to the project root.

Users who are online can instead load the same splits from the Hugging Face hub
(``source="hub"``, needs the ``datasets`` package: ``pip install gnll[hub]``).

Example
-------
>>> from gnll.evaluation.datasets import DATASETS
>>> DATASETS["svamp"].relpath
'svamp/SVAMP.json'
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "DATASETS",
    "DatasetSpec",
    "Example",
    "candidate_data_dirs",
    "detect_format",
    "file_sha256",
    "load_dataset",
    "resolve_data_file",
]

ENV_VAR = "GNLL_DATA_DIR"


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
def _read_jsonl(path: Path) -> Iterable[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            if line.strip():
                try:
                    yield json.loads(line)
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{lineno}: not valid JSON ({exc})") from exc


def _require(record: dict[str, Any], keys: Iterable[str], path: Path, where: str) -> None:
    missing = [k for k in keys if k not in record]
    if missing:
        raise ValueError(
            f"{path}: {where} lacks field(s) {missing}; is this the right file for the dataset?"
        )


def parse_triviaqa(path: Path) -> list[Example]:
    out = []
    for i, r in enumerate(_read_jsonl(path)):
        _require(r, ("question", "aliases"), path, f"record {i}")
        out.append(
            Example(
                id=str(r.get("index", i)),
                question=r["question"].strip(),
                answers=tuple(r["aliases"]),
            )
        )
    return out


def _arith(expr: str) -> float | None:
    """Value of an SVAMP ``Equation`` (numbers, + - * /, parentheses), or ``None``."""
    import ast
    import operator

    ops = {
        ast.Add: operator.add,
        ast.Sub: operator.sub,
        ast.Mult: operator.mul,
        ast.Div: operator.truediv,
    }

    def ev(node: ast.AST) -> float:
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float):
            return float(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in ops:
            return ops[type(node.op)](ev(node.left), ev(node.right))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return -ev(node.operand)
        raise ValueError(node)

    try:
        return ev(ast.parse(expr, mode="eval").body)
    except (SyntaxError, ValueError, ZeroDivisionError, TypeError):
        return None


def parse_svamp(path: Path) -> list[Example]:
    with path.open(encoding="utf-8") as fh:
        data = json.load(fh)
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a JSON list of SVAMP problems")
    out = []
    for i, r in enumerate(data):
        _require(r, ("ID", "Body", "Question", "Answer"), path, f"record {i}")
        ans = float(r["Answer"])
        eq = _arith(str(r.get("Equation", "")))
        out.append(
            Example(
                id=str(r["ID"]),
                question=r["Question"].strip(),
                answers=(format_number(ans),),
                context=r["Body"].strip(),
                numeric_answer=ans,
                extra={
                    "equation": r.get("Equation"),
                    "type": r.get("Type"),
                    # chal-680's Answer (1) contradicts its Equation (5): never show it as an example
                    "consistent": eq is None or abs(eq - ans) < 1e-6,
                },
            )
        )
    return out


def _nq_question(q: str) -> str:
    # NQ-Open questions are lower-case search queries without a question mark; Farquhar et al.
    # append one.
    q = q.strip()
    return q if q.endswith("?") else q + "?"


def parse_nq_open(path: Path) -> list[Example]:
    out = []
    for i, r in enumerate(_read_jsonl(path)):
        _require(r, ("question", "answer"), path, f"record {i}")
        out.append(
            Example(id=str(i), question=_nq_question(r["question"]), answers=tuple(r["answer"]))
        )
    return out


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
        Example(id=str(i), question=r["question"].strip(), answers=tuple(r["answer"]["aliases"]))
        for i, r in enumerate(ds)
    ]


def _hub_svamp() -> list[Example]:
    dd = _import_hf_datasets().load_dataset("ChilleD/SVAMP")
    rows = [r for split in ("train", "test") for r in dd[split]]
    rows.sort(key=lambda r: int(str(r["ID"]).split("-")[-1]))
    return [
        Example(
            id=str(r["ID"]),
            question=r["Question"].strip(),
            answers=(format_number(float(r["Answer"])),),
            context=r["Body"].strip(),
            numeric_answer=float(r["Answer"]),
        )
        for r in rows
    ]


def _hub_nq_open() -> list[Example]:
    ds = _import_hf_datasets().load_dataset("nq_open", split="validation")
    return [
        Example(id=str(i), question=_nq_question(r["question"]), answers=tuple(r["answer"]))
        for i, r in enumerate(ds)
    ]


@dataclass(frozen=True)
class DatasetSpec:
    """Where a dataset's original file lives under a data directory, and how to read it."""

    name: str
    relpath: str
    parse: Callable[[Path], list[Example]]
    hub: Callable[[], list[Example]]
    hub_id: str
    size: int


DATASETS: dict[str, DatasetSpec] = {
    "triviaqa": DatasetSpec(
        "triviaqa",
        "triviaqa/triviaqa_unfiltered_validation.jsonl",
        parse_triviaqa,
        _hub_triviaqa,
        "trivia_qa (unfiltered.nocontext, validation)",
        11313,
    ),
    "svamp": DatasetSpec(
        "svamp", "svamp/SVAMP.json", parse_svamp, _hub_svamp, "ChilleD/SVAMP", 1000
    ),
    "nq_open": DatasetSpec(
        "nq_open",
        "nq_open/NQ-open.dev.jsonl",
        parse_nq_open,
        _hub_nq_open,
        "nq_open (validation)",
        3610,
    ),
}


def detect_format(path: str | Path) -> str:
    """Guess a file's dataset from its first record (``triviaqa``, ``svamp`` or ``nq_open``)."""
    path = Path(path)
    with path.open(encoding="utf-8") as fh:
        head = fh.read(4096).lstrip()
    if head.startswith("["):
        return "svamp"
    first = head.splitlines()[0] if head else ""
    try:
        rec = json.loads(first)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: cannot tell the dataset format from its first line") from exc
    if "aliases" in rec:
        return "triviaqa"
    if "answer" in rec:
        return "nq_open"
    if "Body" in rec:
        return "svamp"
    raise ValueError(f"{path}: unknown dataset format (fields {sorted(rec)})")


def _project_root() -> Path:
    return Path(__file__).resolve().parents[3]


def candidate_data_dirs(data_dir: str | Path | None = None) -> list[Path]:
    """Data directories searched, in order.

    An explicit ``data_dir`` (or else ``$GNLL_DATA_DIR``) is the only place looked at, so a typo is
    an error rather than a silent fall-back to some other copy; without either, ``../shared/data``
    relative to the working directory and to the project root are tried.
    """
    if data_dir:
        return [Path(data_dir).expanduser()]
    if os.environ.get(ENV_VAR):
        return [Path(os.environ[ENV_VAR]).expanduser()]
    dirs = [Path.cwd() / ".." / "shared" / "data", _project_root() / ".." / "shared" / "data"]
    if dirs[0].resolve() == dirs[1].resolve():
        dirs = dirs[:1]
    return dirs


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
        fmt = detect_format(p)
        if fmt != dataset:
            raise ValueError(f"--data_path {p} holds {fmt} data, but the task needs {dataset}")
        return p
    searched = []
    for d in candidate_data_dirs(data_dir):
        p = d / spec.relpath
        if p.is_file():
            return p
        searched.append(str(p))
    raise FileNotFoundError(
        f"no local copy of {dataset}: expected the file '{spec.relpath}' under a data directory; "
        "looked for\n  "
        + "\n  ".join(searched)
        + f"\nGive --data_dir DIR (or set ${ENV_VAR}) pointing at a folder that holds "
        f"'{spec.relpath}', "
        f"--data_path FILE for a single file, or --data_source hub to load {spec.hub_id} from the "
        "Hugging Face hub (needs `pip install datasets` and network)."
    )


def _spec(dataset: str) -> DatasetSpec:
    try:
        return DATASETS[dataset]
    except KeyError:
        raise KeyError(f"unknown dataset {dataset!r}; known: {sorted(DATASETS)}") from None


def file_sha256(path: str | Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_dataset(
    dataset: str,
    *,
    data_dir: str | Path | None = None,
    data_path: str | Path | None = None,
    source: str = "local",
) -> tuple[list[Example], dict[str, Any]]:
    """Load all examples of ``dataset`` and a provenance record (file, sha256, count).

    ``source`` is ``"local"`` (files, see module docstring) or ``"hub"`` (Hugging Face
    ``datasets``).
    """
    spec = _spec(dataset)
    if source == "hub":
        examples = spec.hub()
        return examples, {
            "dataset": dataset,
            "source": "hub",
            "hub_id": spec.hub_id,
            "n": len(examples),
        }
    if source != "local":
        raise ValueError(f"data source must be 'local' or 'hub', got {source!r}")
    path = resolve_data_file(dataset, data_dir, data_path)
    examples = spec.parse(path)
    if not examples:
        raise ValueError(f"{path}: no examples")
    ids = [e.id for e in examples]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path}: duplicate example ids")
    info = {
        "dataset": dataset,
        "source": "local",
        "file": str(path.resolve()),
        "sha256": file_sha256(path),
        "n": len(examples),
    }
    return examples, info
