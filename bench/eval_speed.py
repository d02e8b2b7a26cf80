"""The whole default ``gnll eval`` per question, before and after beam search moved into gnll's loop.

Both arms run ``gnll eval --model M --tasks triviaqa_short --limit N`` with every default (all
measures, 10 samples, 5 beams, the temperature chosen from {0.5, 1.0, 1.5} on held-out questions,
the default clusterer) as separate processes, interleaved; they differ only in
``--model_args beam_decoder=...``:

- ``after``: ``beam_decoder=loop`` (the default): beam search in gnll's loop;
- ``before``: ``beam_decoder=generate``: transformers' beam search, as ``gnll eval`` ran before
  (the rest of the pipeline is the same code in both arms).

Reported: wall time end to end and per stage (``timings.json``), seconds per question, and whether
the outputs are identical (greedy answers, beams, samples, temperatures, measures): the change must
not alter a single deterministic output. Target (issue 17.3c): after >= 2x faster per question.

Usage::

    python bench/eval_speed.py --n 200 --output bench/results/eval_speed.json
    python bench/eval_speed.py --quick
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path
from typing import Any

import common

ARMS = {"after": "beam_decoder=loop", "before": "beam_decoder=generate"}


def run_eval(arm: str, n: int, heldout: int, model: str, workdir: Path) -> dict[str, Any]:
    out = workdir / "run"
    cmd = [
        *common.gnll_cli(),
        "eval",
        "--model",
        model,
        "--model_args",
        ARMS[arm],
        "--tasks",
        "triviaqa_short",
        "--limit",
        str(n),
        "--heldout_size",
        str(heldout),
        "--output_path",
        str(out),
        "--no-progress",
        "--no-plots",
    ]
    res = common.run_measured(cmd, log=workdir / "eval.log")
    if res["returncode"] != 0:
        raise RuntimeError(f"{arm} failed: {(workdir / 'eval.log').read_text()[-2000:]}")
    res["stage_seconds"] = json.loads((out / "timings.json").read_text())["seconds"]
    res["records"] = [
        {
            "greedy": r["greedy"]["token_ids"],
            "beams": [b["token_ids"] for b in r.get("beams", [])],
            "samples": [s["token_ids"] for s in r.get("samples", [])],
            "temperature": r.get("temperature"),
            "measures": r["measures"],
        }
        for r in map(json.loads, (out / "samples.jsonl").open(encoding="utf-8"))
    ]
    return res


def identical(a: list[dict], b: list[dict]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(a)}
    for key in ("greedy", "beams", "samples", "temperature"):
        out[f"same_{key}"] = sum(x[key] == y[key] for x, y in zip(a, b, strict=True))
    diffs = [
        abs(x["measures"][m] - y["measures"][m])
        for x, y in zip(a, b, strict=True)
        for m in x["measures"]
        if x["measures"][m] is not None and y["measures"].get(m) is not None
    ]
    out["max_abs_measure_diff"] = max(diffs, default=0.0)
    return out


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--n", type=int, default=None, help="questions (default 200; quick 3)")
    ap.add_argument(
        "--heldout", type=int, default=None, help="held-out questions (default min(n, 100))"
    )
    ap.add_argument("--repeats", type=int, default=None, help="default 1")
    ap.add_argument("--model", default=common.DEFAULT_MODEL)
    args = ap.parse_args()
    n = args.n or (3 if args.quick else 200)
    heldout = args.heldout or min(n, 100)
    if args.threads:
        import os

        os.environ["OMP_NUM_THREADS"] = str(args.threads)
    info = common.machine()
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in ARMS}
    with tempfile.TemporaryDirectory(prefix="gnll-eval-speed-") as tmp:
        for rep in range(args.repeats or 1):
            for arm in list(ARMS) if rep % 2 == 0 else list(ARMS)[::-1]:
                wd = Path(tmp) / f"{arm}{rep}"
                wd.mkdir()
                runs[arm].append(run_eval(arm, n, heldout, args.model, wd))
                print(f"  {arm} rep {rep}: {runs[arm][-1]['wall_s']:.1f} s", flush=True)
    same = identical(runs["after"][0]["records"], runs["before"][0]["records"])
    for arm in runs.values():
        for r in arm:
            r.pop("records")
    rows = []
    for arm in ARMS:
        wall = statistics.median(r["wall_s"] for r in runs[arm])
        stages = runs[arm][0]["stage_seconds"]
        rows.append(
            {
                "arm": arm,
                "questions": n,
                "held-out": heldout,
                "wall s": wall,
                "s/question": wall / n,
                "beams s": sum(v for k, v in stages.items() if k.startswith("beams")),
                "samples s": sum(v for k, v in stages.items() if k.startswith("samples")),
                "greedy s": stages.get("greedy", float("nan")),
                "load 1-min": statistics.median(r["load_before"][0] for r in runs[arm]),
            }
        )
    ratios = [b["wall_s"] / a["wall_s"] for a, b in zip(runs["after"], runs["before"], strict=True)]
    beam_ratio = rows[1]["beams s"] / rows[0]["beams s"] if rows[0]["beams s"] else float("nan")
    summary = {
        "speedup_median": statistics.median(ratios),
        "speedups": ratios,
        "beam_stage_speedup": beam_ratio,
        "target": 2.0,
        "met": statistics.median(ratios) >= 2.0,
        "identical": same,
    }
    print(common.table(rows))
    print(
        f"\nwhole eval, before/after: {summary['speedup_median']:.2f}x per question (target >= 2x);"
        f" beam stage {beam_ratio:.2f}x; identical greedy {same['same_greedy']}/{n}, beams "
        f"{same['same_beams']}/{n}, samples {same['same_samples']}/{n}, max |measure diff| "
        f"{same['max_abs_measure_diff']:.2g}"
    )
    common.finish(
        "eval_speed", args, {"n": n, "table": rows, "summary": summary, "runs": runs}, info
    )


if __name__ == "__main__":
    main()
