"""Tasks: a dataset, a prompt format and the correctness metrics that fit it, registered by name.

Every dataset is split deterministically (seeded permutation) into a few-shot pool, a held-out pool
(used only to choose the sampling temperature, App. D) and an evaluation pool; ``--limit N`` takes
the first N of the evaluation pool. Short and long tasks of one dataset share the split, so they ask
the same questions. The evaluation pool is, in order of precedence:

- the embedded sample (``source="embedded"``, the default without data files): its stored pools,
  which are the full file's default split (``--seed 0``), so the sample asks the same questions
  with the same few-shot prompt as the full file; with another seed its evaluation pool is kept and
  the few-shot and held-out pools are re-drawn from the rest of the sample;
- the ids listed in ``split_path`` (one per line, ``#`` comments), e.g. a dataset's test split;
- every question of the data file when ``pool_path`` names a second file of the same format (e.g.
  NQ-Open's train file) from which the few-shot and held-out pools are drawn instead: the paper
  evaluates all 3,610 NQ-Open dev questions and takes few-shot examples from train;
- SVAMP loaded from the hub: ChilleD/SVAMP's 300-problem test split (the paper's ">300 test
  instances");
- SVAMP from the original 1,000-problem file, which marks no split: a fixed 300-problem subset
  (:data:`FIXED_EVAL_SUBSETS`, drawn with a constant seed, the same for every ``--seed``), so the
  700 others, like the paper's training problems, only feed the few-shot and held-out pools;
- otherwise everything but the few-shot and held-out pools.

Example
-------
>>> task = get_task("svamp_short")
>>> task.dataset, task.mode, task.max_new_tokens
('svamp', 'short', 50)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from gnll._util.seeds import seed_from
from gnll.backends.base import ChatPrompt
from gnll.evaluation.data.datasets import DATASETS, Example, load_dataset
from gnll.evaluation.data.embedded import SAMPLE_SEED
from gnll.evaluation.data.prompts import (
    BRIEF_LONG,
    BRIEF_SHORT,
    build_messages,
    fewshot_prefix,
    format_block,
)

__all__ = [
    "TASKS",
    "Task",
    "TaskData",
    "get_task",
    "parse_task_list",
    "path_for",
    "register_task",
    "split_indices",
]

#: Sizes of the few-shot and held-out pools (the rest is the evaluation pool).
FEWSHOT_POOL = 20
HELDOUT_POOL = 100
#: Datasets whose file marks no test split: in the original file (all ``DatasetSpec.size`` problems),
#: the evaluation pool is a fixed subset of this size, drawn by a seeded permutation with the
#: constant seed ``FIXED_SUBSET_SEED`` (not ``--seed``); other files are split as usual.
FIXED_EVAL_SUBSETS = {"svamp": 300}
FIXED_SUBSET_SEED = "fixed-eval-subset-v1"


@dataclass(frozen=True)
class Task:
    """A registered evaluation task.

    Attributes
    ----------
    name, dataset:
        Registry name and the dataset it draws from (a key of
        :data:`gnll.evaluation.data.datasets.DATASETS`).
    mode:
        ``"short"`` (brief phrase, few-shot) or ``"long"`` (one sentence, zero-shot).
    instruction, num_fewshot, max_new_tokens:
        The prompt's first line, the number of few-shot examples, the generation cap.
    default_correctness:
        Correctness metrics used when the user does not pick any (``judge`` is added when a judge
        is given).
    """

    name: str
    dataset: str
    mode: str
    instruction: str
    num_fewshot: int
    max_new_tokens: int
    default_correctness: tuple[str, ...]

    @property
    def numeric(self) -> bool:
        """Whether gold answers are numbers (SVAMP): correctness compares numerically."""
        return self.dataset == "svamp"

    def judge_question(self, example: Example) -> str:
        """The question as shown to the judge (SVAMP: body + question)."""
        if example.context:
            return f"{example.context} {example.question}"
        return example.question

    def load(
        self,
        *,
        seed: int = 0,
        data_dir: str | Path | None = None,
        data_path: str | Path | None = None,
        source: str = "auto",
        fewshot_pool: int = FEWSHOT_POOL,
        heldout_pool: int = HELDOUT_POOL,
        split_path: str | Path | None = None,
        pool_path: str | Path | None = None,
    ) -> TaskData:
        """Load the dataset, split it with ``seed`` and draw the few-shot examples."""
        examples, info = load_dataset(
            self.dataset, data_dir=data_dir, data_path=data_path, source=source
        )
        split_path, pool_path = (
            path_for(split_path, self.dataset),
            path_for(pool_path, self.dataset),
        )
        eval_mask, how = None, "seeded permutation"
        pools = None
        if info["source"] == "embedded" and split_path is None and pool_path is None:
            eval_mask = [e.extra["pool"] == "eval" for e in examples]
            how = "the embedded sample's evaluation pool"
            if (seed, fewshot_pool, heldout_pool) == (SAMPLE_SEED, FEWSHOT_POOL, HELDOUT_POOL):
                # the full file's split, kept in the sample: the same questions and prompts
                pools = _stored_pools(examples)
                how += " (the full file's default split)"
            else:
                how += f" (pools re-split with seed {seed})"
        elif split_path is not None:
            eval_mask = _read_split_file(split_path, examples)
            how = f"ids listed in {split_path}"
        elif pool_path is not None:
            pool, pool_info = load_dataset(self.dataset, data_path=pool_path)
            info = {**info, "pool": pool_info}
            eval_mask = [True] * len(examples) + [False] * len(pool)
            examples = examples + [replace(e, id=f"pool:{e.id}") for e in pool]
            how = f"whole file; few-shot and held-out pools from {pool_path}"
        elif any("split" in e.extra for e in examples):
            eval_mask = [e.extra.get("split") == "test" for e in examples]
            how = "the source's test split"
        elif self.dataset in FIXED_EVAL_SUBSETS and len(examples) == DATASETS[self.dataset].size:
            k = FIXED_EVAL_SUBSETS[self.dataset]
            chosen = np.random.default_rng(seed_from(FIXED_SUBSET_SEED, self.dataset))
            keep = set(chosen.permutation(len(examples))[:k].tolist())
            eval_mask = [i in keep for i in range(len(examples))]
            how = f"fixed subset of {k} (the file marks no test split)"
        fs_idx, ho_idx, ev_idx = pools or split_indices(
            len(examples), seed, fewshot_pool, heldout_pool, eval_mask=eval_mask
        )
        info = {**info, "eval_pool": how}
        rng = np.random.default_rng(seed_from(seed, self.dataset, "fewshot"))
        # Examples whose gold answer contradicts the data (SVAMP chal-680) are never shown as examples.
        eligible = [i for i in fs_idx if examples[i].extra.get("consistent", True)]
        k = min(self.num_fewshot, len(eligible))
        chosen = sorted(rng.choice(eligible, size=k, replace=False).tolist())
        fewshot = [examples[i] for i in chosen] if self.num_fewshot else []
        return TaskData(
            task=self,
            examples=examples,
            fewshot=fewshot,
            heldout_idx=ho_idx,
            eval_idx=ev_idx,
            data_info=info,
            seed=seed,
            fewshot_idx=fs_idx,
        )


@dataclass
class TaskData:
    """A task's loaded data: examples, the seeded split and the few-shot prefix."""

    task: Task
    examples: list[Example]
    fewshot: list[Example]
    heldout_idx: list[int]
    eval_idx: list[int]
    data_info: dict[str, Any]
    seed: int
    fewshot_idx: list[int] = field(default_factory=list)
    #: Few-shot examples as chat turns for chat models (:func:`gnll.evaluation.data.prompts.build_messages`).
    fewshot_as_multiturn: bool = False
    prefix: str = field(init=False)

    def __post_init__(self) -> None:
        self.prefix = fewshot_prefix(self.task.instruction, self.fewshot)

    def split(self, name: str, limit: int | None = None) -> list[Example]:
        idx = {"heldout": self.heldout_idx, "eval": self.eval_idx}[name]
        if limit is not None:
            idx = idx[:limit]
        return [self.examples[i] for i in idx]

    def prompt(self, example: Example) -> str:
        """The user prompt (a :class:`~gnll.backends.base.ChatPrompt` with multi-turn few-shot)."""
        text = self.prefix + format_block(example)
        if not (self.fewshot_as_multiturn and self.fewshot):
            return text
        return ChatPrompt(text, build_messages(self.task.instruction, self.fewshot, example))

    def describe(self) -> dict[str, Any]:
        return {
            "task": self.task.name,
            "dataset": self.task.dataset,
            "mode": self.task.mode,
            "data": self.data_info,
            "split_seed": self.seed,
            "n_fewshot_pool": len(self.fewshot_idx),
            "n_heldout_pool": len(self.heldout_idx),
            "n_eval_pool": len(self.eval_idx),
            "fewshot_ids": [e.id for e in self.fewshot],
            "prompt_prefix": self.prefix,
            "max_new_tokens": self.task.max_new_tokens,
            # Only when set, so the fingerprints of single-turn runs stay what they were.
            **({"fewshot_as_multiturn": True} if self.fewshot_as_multiturn else {}),
        }


def _stored_pools(examples: list[Example]) -> tuple[list[int], list[int], list[int]]:
    """The embedded sample's (few-shot, held-out, evaluation) pools, each in its stored order."""
    by_pool: dict[str, list[tuple[int, int]]] = {"fewshot": [], "heldout": [], "eval": []}
    for i, e in enumerate(examples):
        by_pool[e.extra["pool"]].append((e.extra["pool_rank"], i))
    fs, ho, ev = ([i for _, i in sorted(by_pool[p])] for p in ("fewshot", "heldout", "eval"))
    return fs, ho, ev


def split_indices(
    n: int,
    seed: int,
    fewshot_pool: int = FEWSHOT_POOL,
    heldout_pool: int = HELDOUT_POOL,
    *,
    eval_mask: Sequence[bool] | None = None,
) -> tuple[list[int], list[int], list[int]]:
    """Seeded permutation of ``range(n)`` cut into (few-shot pool, held-out pool, evaluation pool).

    With ``eval_mask``, the evaluation pool is exactly the marked indices (in permuted order) and
    the few-shot and held-out pools come from the unmarked ones, so they never overlap it.

    >>> fs, ho, ev = split_indices(10, 0, 2, 3)
    >>> len(fs), len(ho), len(ev), sorted(fs + ho + ev) == list(range(10))
    (2, 3, 5, True)
    >>> fs, ho, ev = split_indices(10, 0, 2, 3, eval_mask=[i < 4 for i in range(10)])
    >>> sorted(ev), len(fs), len(ho), set(fs + ho) & set(ev)
    ([0, 1, 2, 3], 2, 3, set())
    """
    perm = np.random.default_rng(seed_from(seed, "split")).permutation(n).tolist()
    if eval_mask is None:
        if fewshot_pool + heldout_pool >= n:
            raise ValueError(
                f"pools of {fewshot_pool}+{heldout_pool} leave no evaluation questions out of {n}"
            )
        rest, ev = perm[: fewshot_pool + heldout_pool], perm[fewshot_pool + heldout_pool :]
    else:
        if len(eval_mask) != n:
            raise ValueError(f"eval_mask has {len(eval_mask)} entries for {n} examples")
        ev = [i for i in perm if eval_mask[i]]
        rest = [i for i in perm if not eval_mask[i]]
        if not ev:
            raise ValueError("the evaluation pool is empty")
        if len(rest) < fewshot_pool + heldout_pool:
            raise ValueError(
                f"only {len(rest)} questions outside the evaluation pool for the few-shot and "
                f"held-out pools of {fewshot_pool}+{heldout_pool}"
            )
    return rest[:fewshot_pool], rest[fewshot_pool : fewshot_pool + heldout_pool], ev


def path_for(spec: str | Path | None, dataset: str) -> str | None:
    """The file ``spec`` gives ``dataset``: a bare path for every dataset, or ``ds=path,ds=path``.

    >>> path_for("svamp=s.txt,nq_open=nq.txt", "nq_open"), path_for("s.txt", "svamp")
    ('nq.txt', 's.txt')
    >>> path_for("svamp=s.txt", "triviaqa") is None
    True
    """
    if spec is None:
        return None
    spec = str(spec)
    parts = [p.strip() for p in spec.split(",") if p.strip()]
    if not any("=" in p for p in parts):
        return spec
    out = {}
    for p in parts:
        ds, sep, path = p.partition("=")
        if not sep or ds.strip() not in DATASETS:
            raise ValueError(
                f"{spec!r}: expected PATH or DATASET=PATH,... with DATASET in {sorted(DATASETS)}"
            )
        out[ds.strip()] = path.strip()
    return out.get(dataset)


def _read_split_file(path: str | Path, examples: Sequence[Example]) -> list[bool]:
    """Mask of the examples whose ids ``path`` lists (one id per line; blank lines and ``#``)."""
    path = Path(path)
    known = {e.id for e in examples}
    wanted: set[str] = set()
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, 1):
            ident = line.split("#", 1)[0].strip()
            if not ident:
                continue
            if ident not in known:
                raise ValueError(f"{path}:{lineno}: id {ident!r} is not in the dataset")
            wanted.add(ident)
    if not wanted:
        raise ValueError(f"{path}: lists no ids")
    return [e.id in wanted for e in examples]


TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    if task.name in TASKS:
        raise ValueError(f"task {task.name!r} is already registered")
    TASKS[task.name] = task
    return task


for _ds in ("triviaqa", "svamp", "nq_open"):
    register_task(Task(f"{_ds}_short", _ds, "short", BRIEF_SHORT, 5, 50, ("f1",)))
    register_task(Task(f"{_ds}_long", _ds, "long", BRIEF_LONG, 0, 100, ("contains",)))


#: Names that select several tasks in a task list (:func:`parse_task_list`).
TASK_GROUPS = ("all", "short", "long")


def get_task(name: str) -> Task:
    """The registered task ``name``; an unknown name is a :class:`KeyError` that suggests the
    nearest ones (``svamp`` -> ``svamp_long``, ``svamp_short``) and lists the groups.

    >>> get_task("svamp")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    KeyError: "unknown task 'svamp' (did you mean svamp_long or svamp_short?); known tasks: ..."
    """
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(_unknown(name)) from None


def _unknown(name: str) -> str:
    import difflib

    near = [t for t in sorted(TASKS) if t.startswith(f"{name}_")]
    near = near or difflib.get_close_matches(name, [*TASKS, *TASK_GROUPS], n=2, cutoff=0.6)
    hint = f" (did you mean {' or '.join(near)}?)" if near else ""
    groups = ", ".join(TASK_GROUPS)
    return f"unknown task {name!r}{hint}; known tasks: {', '.join(sorted(TASKS))}; groups: {groups}"


def parse_task_list(spec: str) -> list[Task]:
    """``"triviaqa_short,svamp_short"`` -> tasks; ``all``, ``short``, ``long`` select groups."""
    names: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if part == "all":
            names += list(TASKS)
        elif part in ("short", "long"):
            names += [t.name for t in TASKS.values() if t.mode == part]
        else:
            names.append(get_task(part).name)
    if not names:
        raise ValueError("no tasks given")
    return [TASKS[n] for n in dict.fromkeys(names)]
