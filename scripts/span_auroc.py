"""Does the least certain sentence flag a wrong long answer better than the whole answer's G-NLL?

    python scripts/span_auroc.py RUN [RUN ...] [--out docs/img/span_auroc.json]

Each RUN is a finished ``gnll eval`` run directory (e.g. ``--tasks long --measures g-nll --beams 0
--samples 0``). From its greedy answers (tokens and log-probs in ``samples.jsonl``) and its
correctness verdicts (the task's first metric: ``contains`` for long tasks without a judge), it
computes per task and over all tasks of the run: AUROC of the whole-answer G-NLL and of the largest
sentence NLL (:mod:`gnll.spans`), each with its bootstrap standard error, the paired difference and
its one-sided paired-bootstrap p-values (:mod:`gnll.evaluation.results.metrics`), and how many answers have
more than one sentence (on one-sentence answers the two scores differ only by the white space
between sentences). Prints a Markdown table and writes the numbers as JSON.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np

from gnll.evaluation.results.metrics import bootstrap_auroc, paired_bootstrap_test
from gnll.spans import span_nlls


def rows_of(run: Path) -> list[dict]:
    out = []
    with (run / "samples.jsonl").open(encoding="utf-8") as fh:
        for line in fh:
            r = json.loads(line)
            metric = next(iter(r["correctness"]))
            ok = r["correctness"][metric]["correct"]
            g = r["greedy"]
            if ok is None or not g["tokens"]:
                continue
            rep = span_nlls(g["tokens"], g["token_logprobs"], g["text"], "sentence")
            out.append(
                {
                    "task": r["task"],
                    "metric": metric,
                    "correct": float(bool(ok)),
                    "g_nll": rep.total_nll,
                    "max_sentence_nll": rep.max_nll(),
                    "sentences": len(rep.spans),
                }
            )
    return out


def compare(rows: list[dict], n_boot: int, seed: int) -> dict:
    c = np.array([r["correct"] for r in rows])
    g = np.array([r["g_nll"] for r in rows])
    m = np.array([r["max_sentence_nll"] for r in rows])
    a_g, se_g = bootstrap_auroc(c, g, n_boot=n_boot, seed=seed)
    a_m, se_m = bootstrap_auroc(c, m, n_boot=n_boot, seed=seed)
    better = paired_bootstrap_test(c, m, g, n_boot=n_boot, seed=seed)
    worse = paired_bootstrap_test(c, g, m, n_boot=n_boot, seed=seed)
    return {
        "n": len(rows),
        "accuracy": float(c.mean()),
        "multi_sentence": int(sum(r["sentences"] > 1 for r in rows)),
        "auroc_g_nll": a_g,
        "auroc_g_nll_se": se_g,
        "auroc_max_sentence": a_m,
        "auroc_max_sentence_se": se_m,
        "diff": better["diff"],
        "p_max_sentence_better": better["p_value"],
        "p_max_sentence_worse": worse["p_value"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", type=Path)
    ap.add_argument("--bootstrap", type=int, default=1000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=Path("docs/img/span_auroc.json"))
    args = ap.parse_args()
    results = []
    for run in args.runs:
        model = json.loads((run / "run.json").read_text())["config"]["model"]
        rows = rows_of(run)
        groups = {
            t: [r for r in rows if r["task"] == t] for t in dict.fromkeys(r["task"] for r in rows)
        }
        groups["all"] = rows
        for task, rs in groups.items():
            res = compare(rs, args.bootstrap, args.seed)
            res.update(model=model, task=task, metric=rs[0]["metric"])
            results.append(res)
    print(
        "| Model | Task | n | Acc. | >1 sentence | AUROC G-NLL | AUROC max sentence NLL | diff (p better / p worse) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        print(
            f"| {r['model']} | {r['task']} | {r['n']} | {r['accuracy']:.3f} | {r['multi_sentence']} | "
            f"{r['auroc_g_nll']:.3f} ± {r['auroc_g_nll_se']:.3f} | "
            f"{r['auroc_max_sentence']:.3f} ± {r['auroc_max_sentence_se']:.3f} | "
            f"{r['diff']:+.3f} ({r['p_max_sentence_better']:.2f} / {r['p_max_sentence_worse']:.2f}) |"
        )
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
