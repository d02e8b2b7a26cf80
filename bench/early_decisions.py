"""Exact early decisions (issue 37): time to the escalate/refuse decision, early vs waiting for the end.

One process loads SmolLM2-135M-Instruct once and answers the ``triviaqa_long`` questions (one
sentence, zero-shot, up to 100 tokens, rendered as ``gnll eval`` renders them) through the serving
engine (:class:`gnll.serving.engine.BatchingEngine`, the continuous decoding loop ``gnll serve``
uses), one request at a time, in three arms per question, their order rotated per question:

- ``full``: the whole greedy answer (what ``gnll serve`` did before early decisions): its G-NLL
  gives the end-of-answer decision of both policies below;
- ``escalate``: early decisions under the **calibrated** escalate policy: ``--calibration``, by
  default the calibration fitted on SmolLM2's own ``triviaqa_long`` answers
  (``bench/calibrations/smollm2-triviaqa_long.json``, its default ``coverage`` rule; how to
  refit it is below), applied to questions it was not fitted on (``--start``);
- ``refuse``: early decisions under ``--policy refuse --threshold T`` (raw G-NLL threshold).

Reported per policy: decisions that differ from the end-of-answer decision (must be 0), and for
the answers it refuses/escalates: mean seconds to the decision early vs the full answer's seconds
(the decision time without early decisions), their ratio, and tokens generated. Run with ``nice``
on a shared machine: the ratio is taken within one run, question by question.

Where an exact decision can come depends on the threshold: it is the first token at which the
running G-NLL passes it. So the full arm's per-token NLLs also give, exactly and without timing,
the share of each escalated answer generated before its decision at the thresholds that escalate
10%, 20%, ..., 90% of these answers (``summary.sweep``).

The calibration (the SmolLM2 -> Gemma-3-270M cascade cannot be calibrated on this task: Gemma's
``contains`` accuracy, 0.090 on these 400 questions, is below SmolLM2's 0.110, so a certified
cascade threshold escalates nothing)::

    gnll eval --model smollm2-135m-instruct --tasks triviaqa_long --samples 0 --beams 0 \
        --measures g-nll --data_dir ../shared/data --limit 400 -o runs/smollm2-long
    gnll calibrate runs/smollm2-long -o bench/calibrations/smollm2-triviaqa_long.json

Usage::

    nice -n 10 python bench/early_decisions.py --n 200 --start 400 --data_dir ../shared/data \\
        --threads 1 --output bench/results/early_decisions.json
    python bench/early_decisions.py --quick
"""

from __future__ import annotations

import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import common


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--n", type=int, default=None, help="questions (default 200; quick 6)")
    ap.add_argument("--model", default=common.DEFAULT_MODEL)
    ap.add_argument("--threshold", type=float, default=12.0, help="refuse arm's G-NLL threshold")
    ap.add_argument("--task", default="triviaqa_long")
    ap.add_argument(
        "--start",
        type=int,
        default=0,
        help="skip the first START questions of the evaluation pool (those the calibration was "
        "fitted on; shards)",
    )
    ap.add_argument(
        "--data_dir", default=None, help="full datasets (default: the sample shipped with gnll)"
    )
    ap.add_argument(
        "--calibration",
        default=str(common.REPO / "bench" / "calibrations" / "smollm2-triviaqa_long.json"),
        help="the escalate arm's calibration file (or 'auto': the shipped one, fitted on "
        "short-answer prompts)",
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        default=None,
        help="combine the per-question rows of shard JSON files into --output (no decoding)",
    )
    args = ap.parse_args()
    if args.merge:
        merge(args)
        return
    common.setup_threads(args.threads)
    info = common.machine()
    from gnll import GenerationConfig, load_model
    from gnll.evaluation.data.tasks import get_task
    from gnll.measures import g_nll
    from gnll.policy import AbstentionPolicy
    from gnll.serving.engine import BatchingEngine

    n = args.n or (6 if args.quick else 200)
    td = get_task(args.task).load(data_dir=args.data_dir)
    examples = td.split("eval", args.start + n)[args.start :]
    prompts = [td.prompt(ex) for ex in examples]
    model = load_model(args.model, progress=False)
    config = GenerationConfig.greedy(max_new_tokens=td.task.max_new_tokens)
    policies = {
        "escalate": AbstentionPolicy.from_calibration(
            args.calibration, model=model.name, mode="escalate"
        ),
        "refuse": AbstentionPolicy(mode="refuse", threshold=args.threshold),
    }
    for p in policies.values():
        p.early_decision()  # refuses a policy on which early decisions are not exact

    async def run(report) -> list[dict[str, Any]]:
        engine = BatchingEngine(model, max_batch_prompts=1)
        engine.start()
        rows = []
        try:
            arms = ["full", *policies]
            for q, prompt in enumerate(prompts):
                row: dict[str, Any] = {"question": args.start + q}
                k = q % len(arms)
                for arm in arms[k:] + arms[:k]:  # rotate the order: no arm always runs first
                    early = None
                    if arm != "full":
                        early = lambda p=policies[arm]: p.early_decision()  # noqa: E731
                    t = time.perf_counter()
                    out = await engine.decode([prompt], config, early=early)
                    seconds = time.perf_counter() - t
                    gen = out.generations[0][0]
                    facts = gen.early
                    row[arm] = {
                        "seconds": seconds,
                        "tokens": facts.tokens_generated
                        if facts
                        else len(gen.token_ids) + len(gen.terminator_token_ids),
                        "answer_tokens": len(gen.token_ids),
                        "g_nll": g_nll(gen.measured_logprobs),
                        "early": None if facts is None else facts.to_dict(),
                    }
                    if arm == "full":  # the sweep's input: where each threshold would decide
                        row[arm]["nll"] = [-lp for lp in gen.measured_logprobs]
                full_g = _g_nll(row["full"])
                for name, p in policies.items():
                    end = bool(p.decide(full_g)[1])
                    decided = row[name]["early"] is not None
                    at_end = bool(p.decide(_g_nll(row[name]))[1])
                    row[name]["end_decision"] = end
                    row[name]["decision"] = decided or at_end
                rows.append(row)
                if args.output and len(rows) % 20 == 0:
                    report(rows, partial=True)  # a checkpoint: a cut-short run still reports
                if q % 10 == 0 or args.quick:
                    print(
                        f"  q{q}: full {row['full']['seconds']:.2f} s {row['full']['tokens']} tok; "
                        + "; ".join(
                            f"{a} {row[a]['seconds']:.2f} s {row[a]['tokens']} tok "
                            f"{'early' if row[a]['early'] else ''}"
                            for a in policies
                        ),
                        flush=True,
                    )
        finally:
            engine.stop()
        return rows

    def report(rows: list[dict[str, Any]], partial: bool) -> None:
        summary_rows, results = summarise(rows, policies)
        print(common.table(summary_rows), flush=True)
        if "sweep" in results:
            print(common.table(results["sweep"]), flush=True)
        common.finish(
            "early_decisions",
            args,
            {
                "task": args.task,
                "model": model.name,
                "partial": partial,
                "summary": results,
                "per_question": rows,
            },
            dict(info),
        )

    rows = asyncio.run(run(report))
    report(rows, partial=False)


def merge(args: Any) -> None:
    """Shards run side by side (``--start``) on a shared machine, combined into one result."""
    import json

    from gnll.policy import AbstentionPolicy

    shards = [json.loads(Path(f).read_text()) for f in args.merge]
    rows = sorted((r for sh in shards for r in sh["per_question"]), key=lambda r: r["question"])
    if len({r["question"] for r in rows}) != len(rows):
        raise SystemExit("the shards overlap: a question appears twice")
    first = shards[0]
    policies, described = {}, {}
    for name, res in first["summary"].items():
        if name == "sweep":
            continue
        desc = described[name] = res["policy"]
        # Both rules abstain on G-NLL > their threshold: the threshold alone decides the same.
        policies[name] = AbstentionPolicy(mode=desc["policy"], threshold=desc["threshold_g_nll"])
    summary_rows, results = summarise(rows, policies)
    for name, desc in described.items():
        results[name]["policy"] = desc
    print(common.table(summary_rows))
    out = {
        "benchmark": "early_decisions",
        "command": " ".join(sh["command"] for sh in shards)
        + " ; "
        + common.shlex.join(["python", *common.sys.argv]),
        "quick": False,
        "shards": [
            {"command": sh["command"], "partial": sh["partial"], "machine": sh["machine"]}
            for sh in shards
        ],
        "task": first["task"],
        "model": first["model"],
        "summary": results,
        "per_question": rows,
    }
    args.output.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"wrote {args.output}")


def summarise(rows: list[dict[str, Any]], policies: dict[str, Any]) -> tuple[list, dict]:
    summary_rows, results = [], {}
    for name, p in policies.items():
        changed = sum(r[name]["decision"] != r[name]["end_decision"] for r in rows)
        hit = [r for r in rows if r[name]["end_decision"]]
        early_s = [r[name]["seconds"] for r in hit]
        full_s = [r["full"]["seconds"] for r in hit]
        res = {
            "policy": p.describe(),
            "questions": len(rows),
            "abstained": len(hit),
            "decided_early": sum(r[name]["early"] is not None for r in hit),
            "decision_changes": changed,
            "mean_s_to_decision_early": statistics.fmean(early_s) if hit else None,
            "mean_s_to_decision_full": statistics.fmean(full_s) if hit else None,
            "ratio_of_means": statistics.fmean(early_s) / statistics.fmean(full_s) if hit else None,
            "median_paired_ratio": statistics.median(
                e / f for e, f in zip(early_s, full_s, strict=True)
            )
            if hit
            else None,
            "tokens_abstained_early": sum(r[name]["tokens"] for r in hit),
            "tokens_abstained_full": sum(r["full"]["tokens"] for r in hit),
            "tokens_all_early": sum(r[name]["tokens"] for r in rows),
            "tokens_all_full": sum(r["full"]["tokens"] for r in rows),
            "seconds_all_early": sum(r[name]["seconds"] for r in rows),
            "seconds_all_full": sum(r["full"]["seconds"] for r in rows),
        }
        results[name] = res
        summary_rows.append(
            {
                "policy": name,
                "abstained": f"{res['abstained']}/{len(rows)}",
                "changes": changed,
                "s early": res["mean_s_to_decision_early"],
                "s full": res["mean_s_to_decision_full"],
                "ratio": res["ratio_of_means"],
                "tokens early": res["tokens_abstained_early"],
                "tokens full": res["tokens_abstained_full"],
            }
        )
    if all("nll" in r["full"] for r in rows):
        results["sweep"] = sweep(rows)
    return summary_rows, results


def sweep(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Where an exact decision comes at the thresholds escalating 10%, ..., 90% of these answers.

    From the full answers' token NLLs alone: the decision is at the first answer token whose
    running G-NLL (``math.fsum``, as the rule sums) passes the threshold; an empty answer (scored
    by its stop token) is decided at its end. No timing: the share of tokens generated.
    """
    import bisect
    import math

    import numpy as np

    full_g = np.array([r["full"]["g_nll"] for r in rows])
    # Each answer's running G-NLL, once: it never falls (non-negative terms, correctly rounded
    # sums), so the decision token at a threshold is a bisection.
    running = [
        [math.fsum(r["full"]["nll"][:k]) for k in range(1, len(r["full"]["nll"]) + 1)] for r in rows
    ]
    out = []
    for rate in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9):
        tau = float(np.quantile(full_g, 1 - rate))
        early, full, shares = 0, 0, []
        for r, sums in zip(rows, running, strict=True):
            f = r["full"]
            if not f["g_nll"] > tau:
                continue
            at = f["tokens"]
            k = bisect.bisect_right(sums, tau)  # sums[k] is the first past tau
            if f["answer_tokens"] and k < len(sums):
                at = k + 1
            early, full = early + at, full + f["tokens"]
            shares.append(at / f["tokens"])
        out.append(
            {
                "escalated_share": round(len(shares) / len(rows), 3),
                "threshold_g_nll": tau,
                "tokens_to_decision": early,
                "tokens_full": full,
                "tokens_ratio": early / full if full else None,
                "median_paired_share": statistics.median(shares) if shares else None,
            }
        )
    return out


def _g_nll(arm: dict[str, Any]) -> float:
    return arm["g_nll"]


if __name__ == "__main__":
    main()
