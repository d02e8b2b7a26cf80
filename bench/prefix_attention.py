"""What shared-prefix (cascade) attention could save in the sampling stage: an upper bound, measured.

Sampling draws 10 answers per prompt; every row of a decode step attends to its own copy of the
prompt's keys and values (the few-shot prefix, ~180 tokens for TriviaQA short), although the 10
rows of a prompt share them. Cascade attention would read a prompt's prefix once for its rows.
This script times one-token decode steps of the real model at the sampling stage's batch width
with a long cached context (prefix + answer so far) and with the answer alone, on the same
in-place cache: the difference is all the time the prefix costs a step, i.e. the most that
reading it once per prompt instead of once per row could save (less the one read per prompt it
still needs: ``1 / rows_per_prompt`` of it). Nothing in gnll uses cascade attention; this bounds the
lever for issue 17.3c before anyone builds it.

Usage::

    python bench/prefix_attention.py --threads 1 --output bench/results/prefix_attention.json
    python bench/prefix_attention.py --quick
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import common


def _step_seconds(model: Any, rows: int, context: int, steps: int, repeats: int) -> float:
    """Median seconds of a one-token decode step with ``context`` cached positions per row."""
    import torch
    from transformers import StaticCache

    from gnll.backends.hf.kv_cache import cache_argument

    vocab = model.config.vocab_size
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, vocab - 1, (rows, context), generator=gen)
    kv = cache_argument(model)  # `past_key_values` or, since transformers 5.24, `cache`
    times: list[float] = []
    with torch.inference_mode():
        for _ in range(repeats):
            # A preallocated cache written in place, as gnll's loop does: no per-step concatenation
            # whose cost would also grow with the context.
            cache = StaticCache(config=model.config, max_cache_len=context + steps)
            out = model(input_ids=ids, **{kv: cache}, use_cache=True)
            nxt = out.logits[:, -1:].argmax(-1)
            for i in range(steps):
                pos = torch.tensor([context + i])
                t0 = time.perf_counter()
                out = model(input_ids=nxt, **{kv: cache}, cache_position=pos, use_cache=True)
                times.append(time.perf_counter() - t0)
                nxt = out.logits[:, -1:].argmax(-1)
    return statistics.median(times)


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--model", default=common.DEFAULT_MODEL)
    ap.add_argument("--rows", type=int, default=60, help="batch rows (sampling: 6 prompts x 10)")
    ap.add_argument("--rows_per_prompt", type=int, default=10)
    ap.add_argument("--prefix", type=int, default=None, help="shared prefix tokens (default 177)")
    ap.add_argument("--answer", type=int, default=20, help="answer tokens decoded so far")
    ap.add_argument("--steps", type=int, default=None)
    args = ap.parse_args()
    common.setup_threads(args.threads)
    info = common.machine()
    from gnll import load_model

    model = load_model(args.model, progress=False).model
    # 177 tokens: the TriviaQA short prompt's shared head (the first prefill of profile_sampling.json)
    prefix = args.prefix or (40 if args.quick else 177)
    rows = 8 if args.quick else args.rows
    steps = args.steps or (3 if args.quick else 12)
    repeats = 1 if args.quick else 3
    full = _step_seconds(model, rows, prefix + args.answer, steps, repeats)
    answer_only = _step_seconds(model, rows, args.answer, steps, repeats)
    prefix_share = (full - answer_only) / full
    # Cascade attention still reads each prompt's prefix once for its rows.
    bound = prefix_share * (1 - 1 / args.rows_per_prompt)
    row = {
        "rows": rows,
        "prefix tokens": prefix,
        "answer tokens": args.answer,
        "step s (prefix + answer)": full,
        "step s (answer only)": answer_only,
        "prefix share of a step": prefix_share,
        "cascade bound (share saved)": bound,
        "step speed-up bound": 1 / (1 - bound),
    }
    print(common.table([row]))
    common.finish("prefix_attention", args, {"table": [row]}, info)


if __name__ == "__main__":
    main()
