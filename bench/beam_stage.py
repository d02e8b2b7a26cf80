"""The beam stage of ``gnll eval``: beam search in gnll's loop vs transformers' beam search.

One model is loaded once; two backends share its weights and tokenizer:

- ``loop`` (the default, ``beam_decoder="loop"``): gnll's own beam search (``gnll.backends.hf.beam``):
  each prompt prefilled once from the call's shared few-shot prefix and its cache repeated K times,
  two top-K selections per step, prompts whose search is over dropped from the batch, token log-probs
  recorded as beams grow;
- ``generate`` (``beam_decoder="generate"``, what ``gnll eval`` ran before): ``model.generate`` with
  ``num_beams=K`` fed with the same prefill cache, then one teacher-forced pass to score the beams.

Both run the first N TriviaQA short prompts exactly as ``gnll eval`` renders them, K=5 beams, 50 new
tokens, in one ``generate`` call (as one evaluation chunk), interleaved (A B, B A, ...). The beams are
compared: the same token ids per prompt in the same order, log-probs within 1e-4. Target (issue 17):
the loop at least 2x faster.

Usage::

    python bench/beam_stage.py --output bench/results/beam_stage.json
    python bench/beam_stage.py --quick
"""

from __future__ import annotations

from typing import Any

import common
import numpy as np


def compare(a: list[list[Any]], b: list[list[Any]]) -> dict[str, Any]:
    same = sum(
        [g.token_ids + g.terminator_token_ids for g in x]
        == [g.token_ids + g.terminator_token_ids for g in y]
        for x, y in zip(a, b, strict=True)
    )
    diffs = [
        float(np.max(np.abs(np.subtract(g.token_logprobs, h.token_logprobs))))
        for x, y in zip(a, b, strict=True)
        for g, h in zip(x, y, strict=True)
        if g.token_ids == h.token_ids and g.token_ids
    ]
    return {"same_beams": same, "n": len(a), "max_abs_logprob_diff": max(diffs, default=0.0)}


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--prompts", type=int, default=None, help="N prompts (default 64; quick 3)")
    ap.add_argument("--beams", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=None, help="default 3 (quick 1)")
    ap.add_argument("--model", default=common.DEFAULT_MODEL)
    args = ap.parse_args()
    common.setup_threads(args.threads)
    info = common.machine()
    from gnll import GenerationConfig, load_model
    from gnll.backends.hf import HFModel

    loop = load_model(args.model, progress=False)
    generate = HFModel(
        loop.model,
        loop.tokenizer,
        name=loop.name,
        chat_template=loop.chat_template,
        batch_size=loop.batch_size,
        max_batch_tokens=loop.max_batch_tokens,
        beam_decoder="generate",
    )
    n = args.prompts or (3 if args.quick else 64)
    prompts = common.triviaqa_prompts(n)
    cfg = GenerationConfig.beam(args.beams, max_new_tokens=50)
    outs: dict[str, Any] = {}

    def arm(name: str, model: Any):
        def run() -> None:
            outs[name] = model.generate(prompts, cfg)

        return run

    timing = common.interleave(
        {"loop": arm("loop", loop), "generate": arm("generate", generate)},
        repeats=args.repeats or (1 if args.quick else 3),
        warmup=0,
    )
    agree = compare(outs["loop"], outs["generate"])
    ratio = common.paired_ratios(timing["generate"]["seconds"], timing["loop"]["seconds"])
    rows = [
        {
            "arm": name,
            "prompts": n,
            "beams": args.beams,
            "median s": timing[name]["median_s"],
            "s/question": timing[name]["median_s"] / n,
            "load 1-min": float(np.median(timing[name]["load_1min"])),
        }
        for name in ("loop", "generate")
    ]
    summary = {
        "speedup_median_paired": ratio["median_paired_ratio"],
        "speedups": ratio,
        "target": 2.0,
        "met": ratio["median_paired_ratio"] >= 2.0,
        "agreement": agree,
    }
    print(common.table(rows))
    print(
        f"\nbeam stage, generate/loop: {ratio['median_paired_ratio']:.2f}x (target >= 2x); "
        f"same beams for {agree['same_beams']}/{agree['n']} prompts, "
        f"max |log-prob diff| {agree['max_abs_logprob_diff']:.2g}"
    )
    common.finish("beam_stage", args, {"table": rows, "summary": summary, "timing": timing}, info)


if __name__ == "__main__":
    main()
