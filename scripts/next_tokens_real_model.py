"""Next-token distributions of a real model along its greedy answers (a real-model counterpart of
the paper's Fig. 3, whose simulated Dirichlet distributions ``gnll simulate`` draws).

    python scripts/next_tokens_real_model.py [--model smollm2-135m-instruct] [--n 3] \
        [--max_new_tokens 8] [--out docs/img/next_tokens_real_model.png]
    python scripts/next_tokens_real_model.py --replot docs/img/next_tokens_real_model.json

Prompts are the first ``--n`` questions of TriviaQA's evaluation pool in Farquhar et al.'s 5-shot
format; each greedy answer is cut at ``--max_new_tokens`` (8) tokens, so a row's G-NLL is that of
the tokens drawn. The JSON of the plotted numbers is written next to the figure; ``--replot``
redraws the figure from it without the model.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from gnll import load_model
from gnll.evaluation.data.tasks import get_task
from gnll.evaluation.figures.next_tokens import next_token_distributions, plot_next_tokens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--task", default="triviaqa_short")
    ap.add_argument("--n", type=int, default=3)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--max_new_tokens", type=int, default=8)
    ap.add_argument("--data_dir", default=None)
    ap.add_argument("--out", default="docs/img/next_tokens_real_model.png")
    ap.add_argument("--replot", default=None, help="redraw from a committed .json (no model)")
    args = ap.parse_args()
    title = (
        f"{args.model}: p(y_t | x, y_<t), greedy in orange; "
        f"answers cut at {args.max_new_tokens} tokens"
    )
    if args.replot:
        out = plot_next_tokens(json.loads(Path(args.replot).read_text()), args.out, title)
        print(f"wrote {out}")
        return
    td = get_task(args.task).load(data_dir=args.data_dir)
    examples = td.split("eval", args.n)
    model = load_model(args.model, progress=False)
    data = next_token_distributions(
        model, [td.prompt(e) for e in examples], k=args.k, max_new_tokens=args.max_new_tokens
    )
    for d, e in zip(data, examples, strict=True):
        d["question"], d["gold"] = e.question, list(e.answers[:3])
        d.pop("prompt")
    out = plot_next_tokens(data, args.out, title)
    Path(out).with_suffix(".json").write_text(json.dumps(data, indent=1, ensure_ascii=False))
    print(f"wrote {out} and {Path(out).with_suffix('.json')}")


if __name__ == "__main__":
    main()
