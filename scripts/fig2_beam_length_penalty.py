"""Fig. 2's beam curve again, with transformers' default ``length_penalty=1.0`` instead of gnll's 0.

gnll's beam search ranks hypotheses by their raw log-likelihood (``length_penalty=0``), the quantity
the MSP estimate needs; transformers' default divides each finished hypothesis' score by its length,
which changes which hypotheses survive the search, not only their order. This script reruns only the
beam curve of a committed Fig. 2 result (its questions and its greedy verdicts, ``ids`` and
``correct``) with a chosen length penalty, through transformers' own ``generate`` beam search, a
chunk of questions at a time, appending each question's NLL per width to a JSON-lines file so that
a run stopped by its time budget keeps what it finished. ``--length_penalty 0`` reruns gnll's own
setting (its own beam loop) on the same questions, the baseline of a partial run.

    python scripts/fig2_beam_length_penalty.py --model gemma-3-270m --result docs/img/fig2_gemma.json \
        --length_penalty 1.0 --out runs/fig2-lp/gemma-lp1.jsonl --budget_minutes 60
    python scripts/fig2_beam_length_penalty.py --summary runs/fig2-lp/gemma-lp1.jsonl \
        --result docs/img/fig2_gemma.json

Each beam's NLL is the most likely returned beam's (``msp_estimate``, the empty-answer rule), exactly
as ``gnll.evaluation.figures.ablation.run_ablation`` scores it; only the search differs.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any


def _patch_length_penalty(value: float) -> None:
    """Make the ``generate`` beam path use ``value`` instead of gnll's 0 (this script only)."""
    import gnll.backends.hf.hf_generate as hg

    original = hg.HFGenerationConfig

    def config(**kwargs: Any) -> Any:
        if kwargs.get("num_beams", 1) > 1:
            kwargs["length_penalty"] = value
        return original(**kwargs)

    hg.HFGenerationConfig = config  # type: ignore[assignment,misc]


def run(args: argparse.Namespace) -> None:
    from gnll import load_model
    from gnll import measures as M
    from gnll.backends.base import GenerationConfig
    from gnll.evaluation.data.tasks import get_task

    result = json.loads(Path(args.result).read_text())
    td = get_task(result["task"]).load(data_dir=args.data_dir)
    examples = td.split("eval", result["n"])
    if [str(e.id) for e in examples] != [str(i) for i in result["ids"]]:
        raise SystemExit(f"{args.result}: its questions are not this task's first {result['n']}")
    if args.length_penalty == 0:
        # gnll's own setting: its loop's beams, which are transformers' beams at length_penalty=0
        # (tests/backends), and faster.
        model = load_model(args.model, progress=False)
    else:
        _patch_length_penalty(args.length_penalty)
        model = load_model(args.model, progress=False, beam_decoder="generate")
    widths = [int(w) for w in args.widths.split(",") if w]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    done = set()
    if out.exists():
        done = {json.loads(line)["id"] for line in out.read_text().splitlines() if line}
    todo = [e for e in examples if str(e.id) not in done]
    start = time.monotonic()
    max_new = td.task.max_new_tokens
    for c in range(0, len(todo), args.chunk):
        if time.monotonic() - start > args.budget_minutes * 60:
            print(f"time budget reached after {len(done)} questions")
            break
        chunk = todo[c : c + args.chunk]
        prompts = [td.prompt(e) for e in chunk]
        rows: list[dict[str, Any]] = [
            {"id": str(e.id), "length_penalty": args.length_penalty, "nll": {}, "top": {}}
            for e in chunk
        ]
        for w in widths:
            cfg = GenerationConfig.beam(w, max_new_tokens=max_new, seed=None)
            for row, gs in zip(rows, model.generate(prompts, cfg), strict=True):
                row["nll"][str(w)] = M.msp_estimate([g.measured_logprobs for g in gs])
                row["top"][str(w)] = gs[0].text
        with out.open("a", encoding="utf-8") as fh:
            for row in rows:
                fh.write(json.dumps(row) + "\n")
        done.update(r["id"] for r in rows)
        print(f"{len(done)} questions, {time.monotonic() - start:.0f} s", flush=True)


def curves(result_path: str, paths: list[str], *, se: bool = True) -> dict[str, Any]:
    """Each file's beam curve on the questions every file has: ``{"ids", "correct", "files":
    {path: {"length_penalty", "auroc": {width: (AUROC, SE)}}}}`` (SE ``None`` without ``se``)."""
    from gnll.evaluation.results.metrics import auroc, bootstrap_auroc

    result = json.loads(Path(result_path).read_text())
    correct = dict(zip(map(str, result["ids"]), result["correct"], strict=True))
    runs = {
        path: {r["id"]: r for r in map(json.loads, Path(path).read_text().splitlines())}
        for path in paths
    }
    common = set.intersection(*(set(r) for r in runs.values()))
    ids = [str(i) for i in result["ids"] if str(i) in common]  # the questions every file has
    y = [correct[i] for i in ids]
    files: dict[str, Any] = {}
    for path, by_id in runs.items():
        rows = [by_id[i] for i in ids]
        curve = {}
        for w in rows[0]["nll"]:
            scores = [r["nll"][w] for r in rows]
            curve[w] = bootstrap_auroc(y, scores, seed=0) if se else (auroc(y, scores), None)
        files[path] = {"length_penalty": rows[0]["length_penalty"], "auroc": curve, "rows": by_id}
    return {"ids": ids, "correct": y, "committed": result["auroc"]["beam search"], "files": files}


def summary(args: argparse.Namespace) -> None:
    got = curves(args.result, args.summary.split(","))
    ids, y = got["ids"], got["correct"]
    for path, f in got["files"].items():
        shown = {
            w: (round(a, 4), None if se is None else round(se, 4))
            for w, (a, se) in f["auroc"].items()
        }
        print(
            f"{path}: length_penalty {f['length_penalty']}, {len(ids)} questions, "
            f"{int(sum(y))} correct; AUROC (SE) per width: {shown}"
        )
    print(f"committed (length_penalty 0, all {len(got['committed'])} widths):", got["committed"])
    if len(got["files"]) == 2:  # per question: where the two searches' most likely beams differ
        first, second = (f["rows"] for f in got["files"].values())
        for w in next(iter(first.values()))["nll"]:
            d = [first[i]["nll"][w] - second[i]["nll"][w] for i in ids]
            # 1e-3: above the two decoding paths' float noise (1e-4 per token, documented)
            higher = sum(x > 1e-3 for x in d)
            lower = sum(x < -1e-3 for x in d)
            print(
                f"width {w}: NLL higher in the first file on {higher}, lower on {lower} of {len(d)}"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--result", required=True, help="a committed Fig. 2 result .json")
    ap.add_argument("--length_penalty", type=float, default=1.0)
    ap.add_argument("--widths", default="2,3,4,5")  # width 1 is greedy whatever the penalty
    ap.add_argument("--chunk", type=int, default=10)
    ap.add_argument("--budget_minutes", type=float, default=60)
    ap.add_argument("--data_dir", default=None)
    ap.add_argument("--out", default="runs/fig2-lp/beam.jsonl")
    ap.add_argument("--summary", default=None, help="comma list of .jsonl files to summarise")
    args = ap.parse_args()
    summary(args) if args.summary else run(args)


if __name__ == "__main__":
    main()
