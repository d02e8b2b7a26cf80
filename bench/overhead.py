"""Benchmark 1 -- overhead of scoring: gnll's greedy generation with log-probs vs plain ``generate``.

Same TriviaQA short prompts (as ``gnll eval`` builds them), same stop tokens, same batches:

- ``gnll``: ``HFModel.generate(prompts, GenerationConfig.greedy())`` -- tokenisation, chat template,
  log-prob of every token, stop handling and answer parsing included;
- ``plain``: ``model.generate(input_ids, max_new_tokens=50, eos_token_id=<the same stop ids>)`` of
  transformers on the already tokenised prompts, no scores;
- ``gnll-hf-path``: gnll's fallback path (``model.generate`` + a logits processor recording the
  log-probs), i.e. what gnll did before its own decoding loop, for reference.

Arms are interleaved and repeated; the table shows medians and the median of paired ratios. Target:
gnll / plain <= 1.03 at batch 1 and batch 16. A micro-benchmark also times the bookkeeping alone
(logsumexp + gather + host copy on a rows x vocab logits tensor) against one decode step.

Usage::

    python bench/overhead.py --output bench/results/overhead.json
    python bench/overhead.py --quick --output /tmp/overhead.json
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import common
import torch


def plain_runner(model: Any, prompts: list[str], batch_size: int):
    """A closure running transformers' generate on the prompts in gnll's batches, without scores."""
    from transformers import GenerationConfig as HFGenerationConfig

    from gnll import GenerationConfig
    from gnll.backends.hf.prefill import left_padded

    encoded = model.encode(prompts)
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    stop_ids = model.stop_rules(GenerationConfig.greedy().stop).ids.tolist()
    stop_set = set(stop_ids)
    hf = HFGenerationConfig(
        max_new_tokens=50,
        eos_token_id=stop_ids,
        pad_token_id=model.pad_token_id,
        do_sample=False,
    )
    batches = [
        dict(
            zip(
                ("input_ids", "attention_mask"),
                left_padded([encoded[i] for i in order[s : s + batch_size]], model.pad_token_id),
                strict=True,
            )
        )
        for s in range(0, len(order), batch_size)
    ]

    def run() -> int:
        tokens = 0
        with torch.inference_mode():
            for inputs in batches:
                out = model.model.generate(**inputs, generation_config=hf)
                for row in out[:, inputs["input_ids"].shape[1] :].tolist():
                    end = next((t + 1 for t, i in enumerate(row) if i in stop_set), len(row))
                    tokens += end
        return tokens

    return run


def gnll_runner(model: Any, prompts: list[str], batch_size: int, *, hf_path: bool = False):
    from gnll import GenerationConfig
    from gnll.backends.hf import HFModel

    cfg = GenerationConfig.greedy()
    if hf_path:  # the same weights behind transformers' generate
        model = HFModel(
            model.model,
            model.tokenizer,
            name=model.name,
            chat_template=model.chat_template,
            decoder="generate",
        )

    def run() -> int:
        gens = model.generate(prompts, cfg, batch_size=batch_size)
        return sum(len(g.token_ids) + len(g.terminator_token_ids) for [g] in gens)

    return run


def bookkeeping_micro(model: Any, rows: int, reps: int) -> dict[str, float]:
    """Seconds per step of the log-prob bookkeeping alone, next to one decode forward pass."""
    from transformers import DynamicCache

    from gnll.backends.hf.kv_cache import cache_argument

    vocab = model.model.config.vocab_size
    logits = torch.randn(rows, vocab)
    with torch.inference_mode():

        def book() -> None:
            lse = torch.logsumexp(logits, dim=-1)
            chosen = logits.argmax(dim=-1)
            (logits.gather(1, chosen[:, None])[:, 0] - lse).tolist()
            chosen.tolist()

        def argmax_only() -> None:
            logits.argmax(dim=-1).tolist()

        for f in (book, argmax_only):
            f()
        t = time.perf_counter()
        for _ in range(reps):
            book()
        book_s = (time.perf_counter() - t) / reps
        t = time.perf_counter()
        for _ in range(reps):
            argmax_only()
        argmax_s = (time.perf_counter() - t) / reps
        # One decode step at this batch size with a 220-token cache (a TriviaQA prompt).
        ids = torch.randint(0, vocab, (rows, 220))
        steps = []
        for _ in range(max(3, reps // 50)):
            cache = DynamicCache(config=model.model.config)
            kv = {cache_argument(model.model): cache}
            model.model(input_ids=ids, use_cache=True, logits_to_keep=1, **kv)
            t = time.perf_counter()
            model.model(input_ids=ids[:, :1], use_cache=True, logits_to_keep=1, **kv)
            steps.append(time.perf_counter() - t)
    step_s = statistics.median(steps)
    return {
        "rows": rows,
        "bookkeeping_us_per_step": book_s * 1e6,
        "argmax_only_us_per_step": argmax_s * 1e6,
        "extra_us_per_step": (book_s - argmax_s) * 1e6,
        "decode_step_ms": step_s * 1e3,
        "extra_share_of_step": (book_s - argmax_s) / step_s,
    }


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--model", default=common.DEFAULT_MODEL)
    args = ap.parse_args()
    common.setup_threads(args.threads)
    info = common.machine()
    from gnll import load_model

    model = load_model(args.model, progress=False)
    repeats = args.repeats or (1 if args.quick else 5)
    settings = [(1, 1), (2, 2)] if args.quick else [(1, 8), (16, 16)]  # (batch size, prompts)
    results: list[dict[str, Any]] = []
    raw: dict[str, Any] = {}
    for bs, n_prompts in settings:
        prompts = common.triviaqa_prompts(n_prompts)
        arms = {
            "gnll": gnll_runner(model, prompts, bs),
            "plain": plain_runner(model, prompts, bs),
            "gnll-hf-path": gnll_runner(model, prompts, bs, hf_path=True),
        }
        tokens = {name: fn() for name, fn in arms.items()}  # also the warm-up
        timed = common.interleave(arms, repeats, warmup=0)
        ratio = common.paired_ratios(timed["gnll"]["seconds"], timed["plain"]["seconds"])
        ratio_hf = common.paired_ratios(timed["gnll-hf-path"]["seconds"], timed["plain"]["seconds"])
        results.append(
            {
                "batch": bs,
                "prompts": n_prompts,
                "tokens gnll/plain": f"{tokens['gnll']}/{tokens['plain']}",
                "gnll s": timed["gnll"]["median_s"],
                "plain s": timed["plain"]["median_s"],
                "gnll-hf-path s": timed["gnll-hf-path"]["median_s"],
                "gnll/plain": ratio["median_paired_ratio"],
                "hf-path/plain": ratio_hf["median_paired_ratio"],
                "target <= 1.03": "met" if ratio["median_paired_ratio"] <= 1.03 else "MISSED",
                "load 1-min": statistics.median(
                    timed["gnll"]["load_1min"] + timed["plain"]["load_1min"]
                ),
            }
        )
        raw[f"batch{bs}"] = {
            "tokens": tokens,
            "timings": timed,
            "gnll_vs_plain": ratio,
            "hf_path_vs_plain": ratio_hf,
        }
    micro = [
        bookkeeping_micro(model, rows, 20 if args.quick else 300)
        for rows in ((1, 2) if args.quick else (1, 16))
    ]
    bs, n_prompts = settings[-1]
    profile = common.profile_top(gnll_runner(model, common.triviaqa_prompts(n_prompts), bs))
    print(common.table(results))
    print()
    print(common.table(micro))
    print("\ncProfile of the gnll arm at the larger batch (top by own time):")
    print("\n".join(profile))
    info["peak_rss_mb"] = common.peak_rss_mb()
    common.finish(
        "overhead",
        args,
        {
            "repeats": repeats,
            "table": results,
            "bookkeeping": micro,
            "raw": raw,
            "profile": profile,
        },
        info,
    )


if __name__ == "__main__":
    main()
