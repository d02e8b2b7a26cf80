"""Tasks: a dataset, a prompt format and the correctness metrics that fit it, registered by name.

Every dataset is split deterministically (seeded permutation) into a few-shot pool, a held-out pool
(used
only to choose the sampling temperature, App. D) and an evaluation pool; ``--limit N`` takes the
first N
of the evaluation pool. Short and long tasks of one dataset share the split, so they ask the same
questions.

Example
-------
>>> task = get_task("svamp_short")
>>> task.dataset, task.mode, task.max_new_tokens
('svamp', 'short', 50)
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from gnll.backends.base import ChatPrompt
from gnll.evaluation.datasets import Example, load_dataset
from gnll.evaluation.prompts import (
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
    "register_task",
    "split_indices",
]

#: Sizes of the few-shot and held-out pools (the rest is the evaluation pool).
FEWSHOT_POOL = 20
HELDOUT_POOL = 100


@dataclass(frozen=True)
class Task:
    """A registered evaluation task.

    Attributes
    ----------
    name, dataset:
        Registry name and the dataset it draws from (a key of
        :data:`gnll.evaluation.datasets.DATASETS`).
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
        source: str = "local",
        fewshot_pool: int = FEWSHOT_POOL,
        heldout_pool: int = HELDOUT_POOL,
    ) -> TaskData:
        """Load the dataset, split it with ``seed`` and draw the few-shot examples."""
        examples, info = load_dataset(
            self.dataset, data_dir=data_dir, data_path=data_path, source=source
        )
        fs_idx, ho_idx, ev_idx = split_indices(len(examples), seed, fewshot_pool, heldout_pool)
        rng = np.random.default_rng(_seed_from(seed, self.dataset, "fewshot"))
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
    #: Few-shot examples as chat turns for chat models (:func:`gnll.evaluation.prompts.build_messages`).
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
            "n_fewshot_pool": len(self.examples) - len(self.heldout_idx) - len(self.eval_idx),
            "n_heldout_pool": len(self.heldout_idx),
            "n_eval_pool": len(self.eval_idx),
            "fewshot_ids": [e.id for e in self.fewshot],
            "prompt_prefix": self.prefix,
            "max_new_tokens": self.task.max_new_tokens,
            # Only when set, so the fingerprints of single-turn runs stay what they were.
            **({"fewshot_as_multiturn": True} if self.fewshot_as_multiturn else {}),
        }


def _seed_from(*parts: Any) -> int:
    digest = hashlib.sha256("|".join(map(str, parts)).encode()).digest()
    return int.from_bytes(digest[:4], "little")


def split_indices(
    n: int, seed: int, fewshot_pool: int = FEWSHOT_POOL, heldout_pool: int = HELDOUT_POOL
) -> tuple[list[int], list[int], list[int]]:
    """Seeded permutation of ``range(n)`` cut into (few-shot pool, held-out pool, evaluation pool).

    >>> fs, ho, ev = split_indices(10, 0, 2, 3)
    >>> len(fs), len(ho), len(ev), sorted(fs + ho + ev) == list(range(10))
    (2, 3, 5, True)
    """
    if fewshot_pool + heldout_pool >= n:
        raise ValueError(
            f"pools of {fewshot_pool}+{heldout_pool} leave no evaluation questions out of {n}"
        )
    perm = np.random.default_rng(_seed_from(seed, "split")).permutation(n).tolist()
    return (
        perm[:fewshot_pool],
        perm[fewshot_pool : fewshot_pool + heldout_pool],
        perm[fewshot_pool + heldout_pool :],
    )


TASKS: dict[str, Task] = {}


def register_task(task: Task) -> Task:
    if task.name in TASKS:
        raise ValueError(f"task {task.name!r} is already registered")
    TASKS[task.name] = task
    return task


for _ds in ("triviaqa", "svamp", "nq_open"):
    register_task(Task(f"{_ds}_short", _ds, "short", BRIEF_SHORT, 5, 50, ("f1",)))
    register_task(Task(f"{_ds}_long", _ds, "long", BRIEF_LONG, 0, 100, ("contains",)))


def get_task(name: str) -> Task:
    try:
        return TASKS[name]
    except KeyError:
        raise KeyError(f"unknown task {name!r}; known tasks: {', '.join(sorted(TASKS))}") from None


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
