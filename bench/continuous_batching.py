"""Continuous batching vs fixed batches, on the greedy and the sampling stage (issue 17.3b).

One process loads the model once and decodes the same TriviaQA prompts (rendered as ``gnll eval``
renders them) with ``continuous_batching=True`` (a waiting prompt takes the slot of a finished row)
and ``False`` (fixed batches of ``batch_size`` rows, each decoded until its last row ends; finished
rows leave). Arms alternate per repetition. Stages: greedy (one row per prompt) and sampling (10
samples at temperature 1 per prompt, i.e. six prompts per 64-row batch). Reported: seconds per arm
and stage, the speed-up, and whether the outputs agree (greedy: identical token ids; sampling: the
same seeded streams, identical except where float noise from another padding flips a token).

Usage::

    python bench/continuous_batching.py --threads 2 --output bench/results/continuous_batching.json
    python bench/continuous_batching.py --quick
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import common


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--n", type=int, default=None, help="prompts (default 64; quick 4)")
    ap.add_argument("--repeats", type=int, default=None, help="default 2; quick 1")
    ap.add_argument("--model", default=common.DEFAULT_MODEL)
    args = ap.parse_args()
    common.setup_threads(args.threads)
    from gnll import GenerationConfig, load_model
    from gnll.backends.hf import HFModel

    n = args.n or (4 if args.quick else 64)
    repeats = args.repeats or (1 if args.quick else 2)
    prompts = common.triviaqa_prompts(n)
    base = load_model(args.model, progress=False)
    arms = {
        flag: HFModel(
            base.model,
            base.tokenizer,
            name=base.name,
            chat_template=base.chat_template,
            continuous_batching=flag,
        )
        for flag in (True, False)
    }
    stages = {
        "greedy": GenerationConfig.greedy(),
        "sampling": GenerationConfig.sample(10, temperature=1.0, seed=0),
    }
    seconds: dict[tuple[str, bool], list[float]] = {}
    outs: dict[tuple[str, bool], Any] = {}
    for rep in range(repeats):
        for stage, cfg in stages.items():
            for flag in (True, False) if rep % 2 == 0 else (False, True):
                t = time.perf_counter()
                outs[stage, flag] = arms[flag].generate(prompts, cfg)
                seconds.setdefault((stage, flag), []).append(time.perf_counter() - t)
                print(f"  {stage} continuous={flag} rep {rep}: {seconds[stage, flag][-1]:.1f} s")
    rows, summary = [], {}
    for stage in stages:
        on = statistics.median(seconds[stage, True])
        off = statistics.median(seconds[stage, False])
        pairs = [
            (a.token_ids, b.token_ids)
            for ga, gb in zip(outs[stage, True], outs[stage, False], strict=True)
            for a, b in zip(ga, gb, strict=True)
        ]
        same = sum(a == b for a, b in pairs)
        rows.append(
            {
                "stage": stage,
                "prompts": n,
                "sequences": len(pairs),
                "continuous s": on,
                "fixed batches s": off,
                "speed-up": off / on,
                "identical sequences": f"{same}/{len(pairs)}",
            }
        )
        summary[stage] = {"speedup": off / on, "identical": same, "sequences": len(pairs)}
    print(common.table(rows))
    common.finish(
        "continuous_batching",
        args,
        {"n": n, "repeats": repeats, "table": rows, "summary": summary},
        common.machine(),
    )


if __name__ == "__main__":
    main()
