"""Decisions with a guarantee (``gnll.decide``): exact option probabilities vs first-token ones.

Multiple-choice questions are generated from gnll's embedded TriviaQA and SVAMP samples: each
question's gold answer and the answers of three other questions of the same dataset (seeded), in a
seeded order. Each is asked as a ``choice`` decision (the question is the input, the four answers
the options). Per model (SmolLM2-135M-Instruct and Gemma-3-270M), one :func:`gnll.decide` call per
question gives:

- **exact**: each option's whole text teacher-forced, renormalised over the options;
- **first-token**: each option's first token only (the single-token method of decision servers
  that read the next-token scores at the answer position), from the same forward pass.

For each method: accuracy of the most probable option, AUROC and ECE of its probability as the
probability of being right, before calibration and after (isotonic/Platt on ``-log p``, held-out
by 5-fold cross-validation, :class:`gnll.calibration.Calibrator`). The guarantee: over 200 random
50/50 calibration/test splits, the Learn-then-Test threshold fitted on the calibration half for
accuracy ``1 - alpha`` w.p. ``1 - delta``; its violation rate (test accuracy among answered below
``1 - alpha``) must be at most ``delta``. Time: one decision (all four options) vs one greedy
answer to the same question (the instruction prompt ``gnll ask`` uses, up to 32 tokens),
interleaved question by question, on every tenth question (``--time_every``).

Usage::

    OMP_NUM_THREADS=1 nice -n 10 python bench/decisions.py --threads 1 \\
        --output bench/results/decisions.json
    # or one process per model, then combined (what the committed result did):
    python bench/decisions.py --threads 1 --models smollm2-135m-instruct --output a.json
    python bench/decisions.py --threads 1 --models gemma-3-270m --output b.json
    python bench/decisions.py --merge a.json b.json --output bench/results/decisions.json
    python bench/decisions.py --quick
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import common
import numpy as np

MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
ALPHAS = (0.5, 0.6, 0.7, 0.75)
DELTA = 0.1
SPLITS = 200
INSTRUCTIONS = "Which option answers the question correctly?"


def _trivia_answer(record: dict[str, Any]) -> str:
    """The alias most other aliases contain as words (TriviaQA's aliases hold misspellings and
    variants, and the embedded sample keeps no canonical value), shortest on ties."""
    import re

    aliases = record["aliases"]
    cands = [a for a in aliases if a.isascii() and "(" not in a and len(a) >= 2] or aliases

    def support(c: str) -> tuple[int, bool, int]:
        word = re.compile(rf"\b{re.escape(c.lower())}\b")
        cased = any(ch.isupper() or ch.isdigit() for ch in c)
        return sum(bool(word.search(a.lower())) for a in aliases), cased, -len(c)

    return max(cands, key=support)


def _svamp_answer(record: dict[str, Any]) -> str:
    x = float(record["Answer"])
    return str(int(x)) if x.is_integer() else f"{x:g}"


def questions(n_trivia: int, n_svamp: int, seed: int) -> list[dict[str, Any]]:
    """``{dataset, input, options, gold}`` multiple-choice questions (gold + three others' answers)."""
    import json

    from gnll.evaluation.data.embedded import EMBEDDED_DIR

    out = []
    for dataset, n, text, answer in (
        ("triviaqa", n_trivia, lambda r: r["question"], _trivia_answer),
        ("svamp", n_svamp, lambda r: f"{r['Body']} {r['Question']}", _svamp_answer),
    ):
        with open(EMBEDDED_DIR / f"{dataset}.jsonl", encoding="utf-8") as fh:
            rows = [json.loads(line)["record"] for line in fh]
        rng = random.Random(f"{seed}-{dataset}")
        rng.shuffle(rows)
        pool = [(text(r), answer(r)) for r in rows]
        for i, (q, gold) in enumerate(pool[:n]):
            others: list[str] = []
            for j in rng.sample(range(len(pool)), len(pool)):
                a = pool[j][1]
                if j != i and a.lower() != gold.lower() and a.lower() not in map(str.lower, others):
                    others.append(a)
                if len(others) == 3:
                    break
            options = [gold, *others]
            rng.shuffle(options)
            out.append({"dataset": dataset, "input": q, "options": options, "gold": gold})
    return out


def _metrics(p: np.ndarray, y: np.ndarray) -> dict[str, Any]:
    from gnll.calibration import Calibrator
    from gnll.calibration.metrics import probability_metrics

    raw = probability_metrics(p, y)
    try:
        cal = Calibrator(target_accuracy=None, target_coverage=None).fit(-np.log(p), y)
    except ValueError as exc:  # a --quick run may have fewer than 2 right or wrong answers
        return {
            "accuracy": float(y.mean()),
            "auroc": raw["auroc"],
            "ece": raw["ece"],
            "auroc_calibrated": None,
            "ece_calibrated": None,
            "calibration_method": str(exc),
        }
    after = cal.heldout_metrics
    return {
        "accuracy": float(y.mean()),
        "auroc": raw["auroc"],
        "ece": raw["ece"],
        "auroc_calibrated": after["auroc"],
        "ece_calibrated": after["ece"],
        "calibration_method": cal.method_,
    }


def guarantee(p: np.ndarray, y: np.ndarray, alpha: float, splits: int, seed: int) -> dict[str, Any]:
    """Violation rate of the Learn-then-Test threshold over random 50/50 splits."""
    from gnll.calibration.thresholds import accuracy_threshold

    rng = np.random.default_rng(seed)
    s = -np.log(p)
    violations, coverages, accs = 0, [], []
    for _ in range(splits):
        idx = rng.permutation(len(s))
        cal, test = idx[: len(s) // 2], idx[len(s) // 2 :]
        t = accuracy_threshold(s[cal], y[cal], target=1 - alpha, delta=DELTA).threshold
        answered = s[test] <= t
        coverages.append(float(answered.mean()))
        if answered.any():
            acc = float(y[test][answered].mean())
            accs.append(acc)
            violations += acc < 1 - alpha
    return {
        "alpha": alpha,
        "delta": DELTA,
        "splits": splits,
        "violation_rate": violations / splits,
        "mean_test_coverage": float(np.mean(coverages)),
        "mean_test_accuracy_answered": float(np.mean(accs)) if accs else None,
        "splits_answering_some": len(accs),
    }


def _append(path: Path | None, row: dict[str, Any]) -> None:
    if path is not None:
        with path.open("a") as fh:
            fh.write(json.dumps(row) + "\n")


def run_model(
    name: str,
    qs: list[dict[str, Any]],
    splits: int,
    seed: int,
    time_every: int = 1,
    rows_path: Path | None = None,
    compute: bool = True,
) -> dict[str, Any]:
    """Decide every question with ``name`` and summarise. ``rows_path``: a JSONL of per-question
    rows, appended as they come and read back first (a killed run continues; ``compute=False``
    summarises the rows there are)."""
    from gnll import GenerationConfig, decide, load_model
    from gnll.backends.prompting import instruction_prompt
    from gnll.scoring.decisions import answer_from_logprobs, parse_questions

    rows: list[dict[str, Any]] = []
    if rows_path is not None and rows_path.exists():
        rows = [json.loads(line) for line in rows_path.read_text().splitlines() if line.strip()]
    done = {r["k"] for r in rows}
    if compute:
        model = load_model(name, progress=False)
    greedy = GenerationConfig.greedy(max_new_tokens=32, stop=("\n",))
    for k, q in enumerate(qs):
        if k in done or not compute:
            continue
        spec = {
            "type": "choice",
            "instructions": INSTRUCTIONS,
            "choices": [{"value": o} for o in q["options"]],
        }
        [parsed] = parse_questions([spec])
        arms = ["decide", "greedy"] if k % 2 == 0 else ["greedy", "decide"]  # interleaved
        if k % time_every:
            arms = ["decide"]
        seconds: dict[str, float] = {}
        for arm in arms:
            t = time.perf_counter()
            if arm == "decide":
                [exact] = decide(model, q["input"], [parsed]).answers
            else:
                model.generate([instruction_prompt(q["input"])], greedy)
            seconds[arm] = time.perf_counter() - t
        if (k + 1) % 25 == 0:
            print(f"{name}: {k + 1}/{len(qs)} questions", file=sys.stderr, flush=True)
        if exact.type == "refusal":
            rows.append({"k": k, "refused": exact.reason})
            _append(rows_path, rows[-1])
            continue
        first = answer_from_logprobs(
            parsed, [o.first_token_logprob for o in exact.options], method="first-token"
        )
        firsts = [o.first_token_logprob for o in exact.options]
        rows.append(
            {
                "k": k,
                "dataset": q["dataset"],
                "exact_choice": exact.choice,
                "exact_p": max(o.probability for o in exact.options),
                "first_choice": first.choice,
                "first_p": max(o.probability for o in first.options),
                "gold": q["gold"],
                "mass": exact.mass,
                "tokens": [o.num_tokens for o in exact.options],
                "shared_first_token": len(set(firsts)) < len(firsts),
                "decide_s": seconds["decide"],
                "greedy_s": seconds.get("greedy"),
            }
        )
        _append(rows_path, rows[-1])
    rows.sort(key=lambda r: r["k"])
    ok = [r for r in rows if "refused" not in r]
    out: dict[str, Any] = {
        "model": name,
        "questions": len(rows),
        "questions_asked": len(qs),
        "refused": len(rows) - len(ok),
    }
    for method in ("exact", "first"):
        p = np.array([r[f"{method}_p"] for r in ok])
        y = np.array([r[f"{method}_choice"] == r["gold"] for r in ok])
        out[method] = _metrics(p, y)
        out[method]["by_dataset"] = {
            d: float(np.mean([r[f"{method}_choice"] == r["gold"] for r in ok if r["dataset"] == d]))
            for d in ("triviaqa", "svamp")
        }
        out[method]["guarantee"] = [guarantee(p, y, a, splits, seed) for a in ALPHAS]
    out["multi_token_options"] = float(np.mean([max(r["tokens"]) > 1 for r in ok]))
    out["shared_first_token"] = float(np.mean([r["shared_first_token"] for r in ok]))
    timed = [r for r in ok if r["greedy_s"] is not None]
    d, g = [r["decide_s"] for r in timed], [r["greedy_s"] for r in timed]
    out["time"] = {
        "decide_median_s": statistics.median(d),
        "greedy_median_s": statistics.median(g),
        "ratio_median": statistics.median(a / b for a, b in zip(d, g, strict=True)),
        "questions_timed": len(timed),
    }
    out["rows"] = rows
    return out


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--trivia", type=int, default=None, help="TriviaQA questions (default 170)")
    ap.add_argument("--svamp", type=int, default=None, help="SVAMP questions (default 130)")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--splits", type=int, default=SPLITS)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--time_every", type=int, default=10, help="time a greedy answer beside every Nth decision"
    )
    ap.add_argument(
        "--rows",
        type=Path,
        default=None,
        help="per-question rows JSONL (one model): appended as they come, read back on a rerun",
    )
    ap.add_argument(
        "--summarise",
        action="store_true",
        help="only summarise the --rows there are (no model is loaded)",
    )
    ap.add_argument(
        "--merge",
        nargs="+",
        type=str,
        default=None,
        help="combine the per-model JSON files of earlier runs (one model each) into --output",
    )
    args = ap.parse_args()
    common.setup_threads(args.threads)
    n_t = args.trivia or (6 if args.quick else 170)
    n_s = args.svamp or (4 if args.quick else 130)
    splits = 20 if args.quick else args.splits
    qs = questions(n_t, n_s, args.seed)
    info = common.machine()
    if args.merge:
        models = [m for path in args.merge for m in json.loads(Path(path).read_text())["models"]]
    else:
        models = [
            run_model(
                m, qs, splits, args.seed, args.time_every, args.rows, compute=not args.summarise
            )
            for m in args.models.split(",")
        ]
    table = []
    for m in models:
        for method in ("exact", "first"):
            r = m[method]
            row = {
                "model": m["model"],
                "method": "exact" if method == "exact" else "first-token",
                "accuracy": r["accuracy"],
                "AUROC": r["auroc"],
                "ECE": r["ece"],
                "AUROC calibrated": r["auroc_calibrated"],
                "ECE calibrated": r["ece_calibrated"],
            }
            for g in r["guarantee"]:
                row[f"violations a={g['alpha']}"] = g["violation_rate"]
                row[f"coverage a={g['alpha']}"] = g["mean_test_coverage"]
            table.append(row)
    timing = [
        {
            "model": m["model"],
            "decision s (median)": m["time"]["decide_median_s"],
            "greedy answer s (median)": m["time"]["greedy_median_s"],
            "ratio (median)": m["time"]["ratio_median"],
            "multi-token options": m["multi_token_options"],
            "shared first token": m["shared_first_token"],
        }
        for m in models
    ]
    print(common.table(table))
    print(common.table(timing))
    summary = {"n": len(qs), "seed": args.seed, "delta": DELTA, "splits": splits}
    common.finish(
        "decisions",
        args,
        {"summary": summary, "table": table, "timing": timing, "models": models},
        info,
    )


if __name__ == "__main__":
    main()
