"""Build the evaluation sample that ships inside gnll (``--data_source embedded``) from the full files.

The sample is what ``gnll eval`` would use of each full file with the default split (``--seed 0``):
its few-shot pool, its held-out pool and the first questions of its evaluation pool, in that
pool's order, so that a run on the sample asks the same questions with the same few-shot prompt as
the same run on the full file (up to the sample's size). Each line keeps the original record
verbatim, with the pool it belongs to, its rank in that pool and its id in the full file.

    python scripts/build_embedded_sample.py --data_dir DIR            # write the files
    python scripts/build_embedded_sample.py --data_dir DIR --check    # byte-for-byte comparison

``DIR`` holds the three datasets' original files (``triviaqa/triviaqa_unfiltered_validation.jsonl``,
``svamp/SVAMP.json``, ``nq_open/NQ-open.dev.jsonl``); by default ``$GNLL_DATA_DIR``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

from gnll.evaluation.data.datasets import DATASETS, resolve_data_file
from gnll.evaluation.data.embedded import EMBEDDED_DIR, SAMPLE_SIZES, SAMPLE_TASKS
from gnll.evaluation.data.records import iter_json_array, iter_jsonl
from gnll.evaluation.data.tasks import get_task


def _rows(dataset: str, path: Path) -> list[dict]:
    reader = iter_json_array if dataset == "svamp" else iter_jsonl
    return [dict(row.data) for row in reader(path)]


def sample_lines(dataset: str, data_dir: str | None) -> list[str]:
    """The sample file's lines for ``dataset``: the full file's default split, cut to size."""
    path = resolve_data_file(dataset, data_dir)
    data = get_task(SAMPLE_TASKS[dataset]).load(seed=0, data_dir=data_dir, source="local")
    rows = _rows(dataset, path)
    if len(rows) != len(data.examples):
        raise SystemExit(f"{path}: {len(rows)} records but {len(data.examples)} examples")
    pools = {
        "fewshot": data.fewshot_idx,
        "heldout": data.heldout_idx,
        "eval": data.eval_idx[: SAMPLE_SIZES[dataset]],
    }
    chosen = {i: (pool, rank) for pool, idx in pools.items() for rank, i in enumerate(idx)}
    lines = []
    for i in sorted(chosen):  # the full file's order, which the few-shot draw depends on
        pool, rank = chosen[i]
        rec = {"id": data.examples[i].id, "pool": pool, "rank": rank, "record": rows[i]}
        lines.append(json.dumps(rec, ensure_ascii=False, sort_keys=True) + "\n")
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data_dir", default=os.environ.get("GNLL_DATA_DIR"))
    ap.add_argument("--out", default=str(EMBEDDED_DIR), help="where to write (default: the package)")
    ap.add_argument("--check", action="store_true", help="compare with the files in --out instead")
    args = ap.parse_args()
    if not args.data_dir:
        ap.error("give --data_dir DIR (the folder of the three full files) or set $GNLL_DATA_DIR")
    out = Path(args.out)
    differ = []
    for dataset in DATASETS:
        text = "".join(sample_lines(dataset, args.data_dir)).encode("utf-8")
        target = out / f"{dataset}.jsonl"
        digest = hashlib.sha256(text).hexdigest()[:12]
        if args.check:
            same = target.is_file() and target.read_bytes() == text
            print(f"{target}: {'identical' if same else 'DIFFERS'} (rebuilt sha256 {digest})")
            differ += [] if same else [str(target)]
        else:
            out.mkdir(parents=True, exist_ok=True)
            target.write_bytes(text)
            n = text.count(b"\n")
            print(f"{target}: {n} questions, {len(text):,} bytes, sha256 {digest}")
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
