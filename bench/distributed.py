"""Benchmark -- ``gnll score`` on Ray against the local engine: overhead and scaling of replicas.

The same rows (TriviaQA questions with their first alias as the answer) are scored by four arms,
each timed from model load to the last row written (the model load is included):

- ``local``: the local engine in this process with T torch threads;
- ``ray_1xT``: Ray, 1 replica of T CPUs (threads) -- Ray's overhead is ``ray_1xT / local - 1``;
- ``ray_1x1`` and ``ray_2x1``: Ray, 1 and 2 replicas of 1 thread each -- scaling efficiency is
  ``(ray_1x1 / ray_2x1) / 2``.

Arms are interleaved (A B C D, then D C B A, ...) under one local Ray cluster of this machine's
cores, started once. Targets on 2 cores: overhead <= 10%; efficiency >= 0.85. Outputs of
``local`` and ``ray_1xT`` must be byte-identical (the same chunks on the same thread count).

Usage::

    python bench/distributed.py --rows 2000 --output bench/results/distributed.json
    python bench/distributed.py --quick
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import common


def write_rows(path: Path, n: int) -> None:
    from gnll.evaluation.data.datasets import load_dataset

    with path.open("w") as out:
        for ex in load_dataset("triviaqa")[0][:n]:
            out.write(json.dumps({"id": ex.id, "question": ex.question, "answer": ex.answers[0]}))
            out.write("\n")


def sizing(per_replica: float, efficiency: float) -> list[dict[str, Any]]:
    """Projected throughput of N replicas of the measured kind on a 4-node, 8-GPU cluster.

    Each replica runs at the measured single-replica rate, discounted once by the measured scaling
    efficiency (the driver's per-chunk work does not grow with N; the pool only has to be fed).
    """
    rows = []
    for layout, n in (
        ("1 node, 1 GPU", 1),
        ("1 node, 2 GPUs", 2),
        ("2 nodes, 4 GPUs", 4),
        ("4 nodes, 8 GPUs (1 replica/GPU)", 8),
    ):
        rate = per_replica * (n if n == 1 else n * min(efficiency, 1.0))
        rows.append(
            {
                "layout": layout,
                "replicas": n,
                "projected rows/s": round(rate, 1),
                "hours per 10M rows": round(1e7 / rate / 3600, 1),
            }
        )
    return rows


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--rows", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--chunk-size", type=int, default=64)
    ap.add_argument("--model", default=common.DEFAULT_MODEL)
    args = ap.parse_args()
    rows = 40 if args.quick else args.rows
    repeats = 1 if args.quick else args.repeats
    threads = args.threads or os.cpu_count() or 1
    import ray
    import torch

    from gnll import load_model
    from gnll.distributed.cluster import Cluster
    from gnll.distributed.scoring import run_score_job as run_ray
    from gnll.scoring import ScoreJob, run_score_job

    info = common.machine()
    ray.init(num_cpus=threads, include_dashboard=False, log_to_driver=False)
    with tempfile.TemporaryDirectory(prefix="gnll-distributed-") as tmp:
        inp = Path(tmp) / "rows.jsonl"
        write_rows(inp, rows)

        def job(name: str) -> ScoreJob:
            return ScoreJob(
                input=str(inp), output=str(Path(tmp) / f"{name}.jsonl"), input_format="jsonl",
                output_format="jsonl", errors=Path(tmp) / f"{name}.errors.jsonl",
                long=False, chunk_size=args.chunk_size,
                progress=False,
            )  # fmt: skip

        def local() -> None:
            torch.set_num_threads(threads)
            run_score_job(load_model(args.model, progress=False), job("local"))

        def on_ray(name: str, replicas: int, cpus: int) -> Any:
            cluster = Cluster("auto", replicas=replicas, cpus_per_replica=cpus)
            return lambda: run_ray(job(name), args.model, {}, cluster)

        arms = {
            "local": local,
            "ray_1xT": on_ray("ray_1xT", 1, threads),
            "ray_1x1": on_ray("ray_1x1", 1, 1),
            "ray_2x1": on_ray("ray_2x1", min(2, threads), 1),
        }
        res = common.interleave(arms, repeats, warmup=0)
        same = (Path(tmp) / "local.jsonl").read_bytes() == (
            Path(tmp) / "ray_1xT.jsonl"
        ).read_bytes()
    ray.shutdown()
    med = {k: v["median_s"] for k, v in res.items()}
    overhead = common.paired_ratios(res["ray_1xT"]["seconds"], res["local"]["seconds"])
    speedup = common.paired_ratios(res["ray_1x1"]["seconds"], res["ray_2x1"]["seconds"])
    summary = {
        "benchmark": "distributed",
        "command": "python " + " ".join(["bench/distributed.py", *sys.argv[1:]]),
        "quick": args.quick,
        "rows": rows,
        "threads": threads,
        "repeats": repeats,
        "chunk_size": args.chunk_size,
        "model": args.model,
        "median_s": med,
        "rows_per_s": {k: rows / v for k, v in med.items()},
        "ray_overhead": overhead["median_paired_ratio"] - 1,
        "overhead_ratios": overhead,
        "speedup_2_vs_1": speedup["median_paired_ratio"],
        "scaling_efficiency": speedup["median_paired_ratio"] / 2,
        "speedup_ratios": speedup,
        "local_equals_ray_bytes": same,
        "sizing": sizing(rows / med["ray_1x1"], speedup["median_paired_ratio"] / 2),
        "targets": {"ray_overhead_max": 0.10, "scaling_efficiency_min": 0.85},
        "runs": res,
        "machine": {**info, "load_average_end": common.load_average()},
    }
    print(
        f"rows {rows}, T={threads} threads, {repeats} repeat(s); medians (s, model load included):"
    )
    for k, v in med.items():
        print(f"  {k:8s} {v:7.1f} s  {rows / v:6.1f} rows/s")
    print(
        f"Ray overhead vs local at {threads} threads: {summary['ray_overhead']:+.1%} (target <= 10%)"
    )
    print(f"1 -> 2 single-thread replicas: {summary['speedup_2_vs_1']:.2f}x, efficiency "
          f"{summary['scaling_efficiency']:.2f} (target >= 0.85)")  # fmt: skip
    print(f"local and ray_1xT outputs byte-identical: {same}")
    print("projection from the single-thread replica:")
    print(common.table(summary["sizing"]))
    print(f"load average {info['load_average_start']} -> {common.load_average()}")
    if args.output:
        args.output.write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
