"""The paper's Fig. 2 ablation: AUROC of single-sequence NLL estimators vs. number of candidates.

    python scripts/fig2_ablation.py [--model smollm2-135m-instruct] [--task triviaqa_short] \
        [--limit 100] [--baseline_run RUN_DIR] [--out runs/fig2/ablation.png]
    python scripts/fig2_ablation.py --average a.json,b.json --out docs/img/fig2_mean.png
    python scripts/fig2_ablation.py --result a.json --baseline_run RUN_DIR --out a.png

Writes the figure and its numbers (``.json``) next to each other. ``--baseline_run`` is a finished
``gnll eval`` run of the same model and task (at least ``--limit`` questions, the same seed): its
PE ... D-SE scores become the figure's reference lines. ``--average`` draws the mean of earlier
results (one per model; gnll's reading of Fig. 2's "Average AUROC"). ``--result`` adds a baseline
run's lines to an earlier result (made side by side with its ``gnll eval`` run) and redraws it.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gnll import load_model
from gnll.evaluation.data.tasks import get_task
from gnll.evaluation.figures.ablation import (
    add_baselines,
    average_ablations,
    baseline_scores,
    plot_ablation,
    run_ablation,
)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--task", default="triviaqa_short")  # the paper's ablation dataset
    ap.add_argument("--limit", type=int, default=100)
    ap.add_argument("--widths", default="1,2,3,4,5")
    ap.add_argument("--temperatures", default="0.1,0.5,1.0")
    ap.add_argument("--samples", type=int, default=10)
    ap.add_argument("--data_dir", default=None)
    ap.add_argument("--baseline_run", default=None, help="a gnll eval run dir for PE ... D-SE")
    ap.add_argument("--average", default=None, help="comma list of result .json files to average")
    ap.add_argument("--result", default=None, help="an earlier result .json to add baselines to")
    ap.add_argument("--out", default="runs/fig2/ablation.png")
    args = ap.parse_args()
    if args.average:
        runs = [json.loads(Path(f).read_text()) for f in args.average.split(",") if f]
        result = average_ablations(runs)
        models = ", ".join(str(r.get("model")) for r in runs)
        title = f"mean of {len(runs)} runs ({models}), n={result['n']}"
    elif args.result:
        result = json.loads(Path(args.result).read_text())
        if args.baseline_run:
            scores = baseline_scores(Path(args.baseline_run) / "samples.jsonl", result["task"])
            add_baselines(result, scores)
        title = f"{result.get('model')}, {result['task']}, n={result['n']}"
    else:
        td = get_task(args.task).load(data_dir=args.data_dir)
        baselines = None
        if args.baseline_run:
            baselines = baseline_scores(Path(args.baseline_run) / "samples.jsonl", args.task)
        model = load_model(args.model, progress=False)
        result = run_ablation(
            model,
            td,
            limit=args.limit,
            widths=[int(w) for w in args.widths.split(",") if w],
            temperatures=[float(t) for t in args.temperatures.split(",") if t],
            samples=args.samples,
            baselines=baselines,
        )
        result["model"] = args.model
        title = f"{args.model}, {args.task}, n={result['n']}"
    out = plot_ablation(result, args.out, title)
    Path(out).with_suffix(".json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out} and {Path(out).with_suffix('.json')}")


if __name__ == "__main__":
    main()
