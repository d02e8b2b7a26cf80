"""The paper's Fig. 2 ablation: AUROC of single-sequence NLL estimators vs. number of candidates.

    python scripts/fig2_ablation.py [--model smollm2-135m-instruct] [--task triviaqa_short] \
        [--limit 100] [--out docs/img/fig2_ablation.png]

Writes the figure and its numbers (``.json``) next to each other.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gnll import load_model
from gnll.evaluation.data.tasks import get_task
from gnll.evaluation.figures.ablation import plot_ablation, run_ablation


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--task", default="triviaqa_short")  # the paper's ablation dataset
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--widths", default="1,2,3,4,5")
    ap.add_argument("--temperatures", default="0.1,0.5,1.0")
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--data_dir", default=None)
    ap.add_argument("--out", default="docs/img/fig2_ablation.png")
    args = ap.parse_args()
    td = get_task(args.task).load(data_dir=args.data_dir)
    model = load_model(args.model, progress=False)
    result = run_ablation(
        model,
        td,
        limit=args.limit,
        widths=[int(w) for w in args.widths.split(",") if w],
        temperatures=[float(t) for t in args.temperatures.split(",") if t],
        samples=args.samples,
    )
    result["model"] = args.model
    out = plot_ablation(result, args.out, f"{args.model}, {args.task}, n={result['n']}")
    Path(out).with_suffix(".json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out} and {Path(out).with_suffix('.json')}")


if __name__ == "__main__":
    main()
