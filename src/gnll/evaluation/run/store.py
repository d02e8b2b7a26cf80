"""Where a run keeps its work: the output directory, each task's fingerprint and its stage caches.

A :class:`TaskRun` is one task of a run: its data, its directory ``tasks/<name>/``, its fingerprint
(model, prompt, data, split; checked on resume) and the JSONL caches of its stages, opened once and
named by a hash of the configuration that produced them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gnll._util import jsonable, read_json
from gnll._util.runfiles import RunDir
from gnll._util.seeds import stable_hash
from gnll.backends.identity import describe_diff, fill_unknown, outcome_args
from gnll.evaluation.data.tasks import TaskData
from gnll.evaluation.run.cache import JsonlCache, write_json_atomic
from gnll.evaluation.run.config import EvalConfig
from gnll.evaluation.run.rundir import clear_previous_run

logger = logging.getLogger(__name__)

__all__ = [
    "CACHE_VERSION",
    "OUTPUT_ENTRIES",
    "FingerprintMismatchError",
    "TaskRun",
    "prepare_output_dir",
]

# 3: samples seeded by (prompt, sample), not by chunk. 4: beams ranked (and sampled empty answers
# scored) by the empty-answer rule: a cache of version 3 may hold an empty top beam ranked first
# with log-likelihood 0, so it is refused instead of resumed.
CACHE_VERSION = 4
#: Files and folders an evaluation writes into its output directory (and clears when starting over).
OUTPUT_ENTRIES = RunDir.ENTRIES


class FingerprintMismatchError(RuntimeError):
    """The output directory holds a run with a different model, prompt or data."""


class EarlierRunError(RuntimeError):
    """The output directory holds an earlier run and neither resuming nor overwriting was asked."""


def check_earlier_run(out: Path, *, resume: bool, overwrite: bool = False) -> None:
    """Refuse an earlier run in ``out`` unless told to ``resume`` or ``overwrite`` it; reads only,
    so it can run before the model loads (a refused command costs no load)."""
    if resume or not out.is_dir():
        return
    present = [e for e in OUTPUT_ENTRIES if (out / e).exists() or (out / e).is_symlink()]
    if present and not overwrite:
        what = "a finished run" if RunDir(out).results.exists() else "an unfinished run"
        raise EarlierRunError(
            f"{out} holds {what} ({', '.join(present)}); nothing was deleted. Pass --resume to "
            "continue it, --overwrite to delete it and start over, or choose another --output"
        )


def prepare_output_dir(out: Path, *, resume: bool, overwrite: bool = False) -> None:
    """Create ``out``; with ``overwrite``, remove what an earlier run wrote there (and say so).

    An earlier run (finished or not: its caches may hold hours of work) is never deleted without
    ``overwrite``: a mistyped ``--output`` must not cost a day. Only files gnll writes are
    removed; anything else makes it refuse before deleting anything
    (:func:`~gnll.evaluation.run.rundir.clear_previous_run`). The caller holds the directory's lock.
    """
    out.mkdir(parents=True, exist_ok=True)
    check_earlier_run(out, resume=resume, overwrite=overwrite)
    if resume:
        return
    removed = clear_previous_run(out, OUTPUT_ENTRIES)
    if removed:
        logger.warning(
            "%s: starting over (removed %s; pass --resume to continue a run)", out, removed
        )


def fingerprint(cfg: EvalConfig, data: TaskData, identity: dict[str, Any]) -> dict[str, Any]:
    """Everything that makes a task's cached generations belong to this run."""
    return {
        "cache_version": CACHE_VERSION,
        "model": cfg.model,
        # Throughput knobs may change on resume (lower max_batch_tokens after an OOM);
        # secrets are never written; what the model *is* must not change.
        "model_args": outcome_args(cfg.model_args),
        "model_identity": identity,
        "task": data.task.name,
        "prompt_prefix": data.prefix,
        "max_new_tokens": data.task.max_new_tokens,
        "data": {k: data.data_info.get(k) for k in ("dataset", "source", "sha256", "hub_id", "n")},
        "split_seed": data.seed,
        "pools": [len(data.heldout_idx), len(data.eval_idx)],
        # which questions the pools hold (a split file or pool file changes them)
        "pool_ids": stable_hash(
            [
                [data.examples[i].id for i in data.heldout_idx],
                [data.examples[i].id for i in data.eval_idx],
            ]
        ),
    }


@dataclass
class TaskRun:
    """One task of a run: its data, its directory, its checked fingerprint and its caches."""

    data: TaskData
    dir: Path
    fingerprint: dict[str, Any]
    _caches: dict[Path, JsonlCache] = field(default_factory=dict, repr=False)

    @classmethod
    def open(cls, out: Path, data: TaskData, fp: dict[str, Any]) -> TaskRun:
        """The task's directory under ``out``, after checking ``fp`` against a stored fingerprint.

        Raises :class:`FingerprintMismatchError` listing every differing field when the directory
        holds another configuration's results.
        """
        tdir = out / "tasks" / data.task.name
        path = tdir / "fingerprint.json"
        if not path.exists():
            tdir.mkdir(parents=True, exist_ok=True)
            write_json_atomic(path, fp)
            return cls(data, tdir, fp)
        old = read_json(path)
        new = jsonable(fp, nan="keep")
        if fill_unknown(old, new) != new:
            diffs = ["  " + line for line in describe_diff(old, new)]
            raise FingerprintMismatchError(
                f"{tdir} holds results of task {data.task.name} produced with a different "
                "configuration:\n"
                + "\n".join(diffs)
                + "\nThe cached generations do not belong to this run. Use a new "
                f"--output, or pass --overwrite instead of --resume to delete {out}'s "
                "earlier run and start over."
            )
        # Same run; a hub commit unknown before the first download is not a change, but once
        # known it is recorded, so a different commit is refused later on.
        if old != new:
            write_json_atomic(path, fp)
        return cls(data, tdir, fp)

    @property
    def name(self) -> str:
        return self.data.task.name

    @property
    def cache_key(self) -> str:
        """The fingerprint's part of cache headers. The model identity is guarded by
        ``fingerprint.json`` alone, so filling in a commit unknown at the first run keeps the
        caches."""
        return stable_hash({k: v for k, v in self.fingerprint.items() if k != "model_identity"}, 16)

    def cache(self, stage: str, header: dict[str, Any]) -> JsonlCache:
        """The cache ``cache/<stage>-<hash of header>.jsonl`` (opened once per run)."""
        path = self.dir / "cache" / f"{stage}-{stable_hash(header)}.jsonl"
        if path not in self._caches:
            self._caches[path] = JsonlCache(path, header)
        return self._caches[path]
