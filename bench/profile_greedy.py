"""Where one batched greedy call spends its time: prefill vs decode forwards, and a cProfile.

The diagnostic behind the backend's grouped prefill and late row dropping (BENCHMARKS.md, "What the
backend does to be fast"): one ``model.generate`` call over the first N TriviaQA short prompts (one
batch, as a ``gnll eval`` chunk), with every forward pass's shape and time recorded. Prefill forwards
are those with more than one column; the rest are decode steps. To see what a change buys, run it
on both commits (``git checkout``) under the same load.

``--samples N --temperature T`` profiles a sampling call instead (N answers per prompt, as the
sampling stage of ``gnll eval`` draws them): where the evaluation's largest stage spends its time.

Usage::

    python bench/profile_greedy.py --threads 1 --output /tmp/profile_greedy.json
    python bench/profile_greedy.py --threads 1 --prompts 24 --samples 10 --temperature 1.5 \
        --output bench/results/profile_sampling.json
    python bench/profile_greedy.py --quick
"""

from __future__ import annotations

import time
from typing import Any

import common


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--prompts", type=int, default=None, help="N prompts (default 64; quick 4)")
    ap.add_argument("--model", default=common.DEFAULT_MODEL)
    ap.add_argument("--samples", type=int, default=0, help="sample N per prompt (default: greedy)")
    ap.add_argument("--temperature", type=float, default=1.0, help="with --samples")
    args = ap.parse_args()
    common.setup_threads(args.threads)
    info = common.machine()
    from gnll import GenerationConfig, load_model

    model = load_model(args.model, progress=False)
    n = args.prompts or (4 if args.quick else 64)
    prompts = common.triviaqa_prompts(n)
    if args.samples:
        cfg = GenerationConfig.sample(
            num_samples=args.samples, temperature=args.temperature, max_new_tokens=50, seed=0
        )
    else:
        cfg = GenerationConfig.greedy(max_new_tokens=50)
    gens: list[Any] = []
    with common.counting(model.model) as counter:
        t0 = time.perf_counter()
        profile = common.profile_top(lambda: gens.extend(model.generate(prompts, cfg)), n=12)
        wall = time.perf_counter() - t0
    prefill = [s for s in counter.shapes if s[1] > 1]
    decode = [s for s in counter.shapes if s[1] == 1]
    tokens = sum(len(g.token_ids) for per_prompt in gens for g in per_prompt)
    row = {
        "prompts": n,
        "answers per prompt": cfg.num_sequences,
        "wall s": wall,
        "generated tokens": tokens,
        "ms per token": 1000 * wall / max(tokens, 1),
        "prefill forwards": len(prefill),
        "prefill positions": sum(r * c for r, c, _ in prefill),
        "prefill s": sum(t for *_, t in prefill),
        "decode steps": len(decode),
        "decode s": sum(t for *_, t in decode),
        "other s": wall - counter.seconds,
    }
    print(common.table([row]))
    print("\ncProfile (top by own time):\n" + "\n".join(profile))
    results = {"table": [row], "forwards": counter.shapes, "profile": profile, "config": repr(cfg)}
    common.finish("profile_greedy", args, results, info)


if __name__ == "__main__":
    main()
