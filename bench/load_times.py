"""Load times of the embedded models and greedy tokens/second of the default one (for issue 2).

1. First load: a child process with ``GNLL_CACHE`` pointing at a fresh temporary directory runs
   ``load_model(name)`` -- the GGUF is de-quantised and converted to a cached safetensors checkpoint
   -- and then one short greedy ``generate`` (first use also builds the tokenizer's stop-token
   table, cached on disk too).
2. Cached load: more child processes with that same cache run the same; the median is reported.
   ``load_model`` time is measured inside the child after ``import gnll.backends.hf`` (which imports
   torch and transformers, timed apart as "import s"); the child's wall time (Python start, imports
   and exit included) is reported next to it.
3. Greedy tokens/second of the default model at batch 1 and batch 16 (in this process), on
   (a) TriviaQA short prompts (answers stop at a newline: prefill-heavy) and (b) open-ended prompts
   generating up to 64 tokens with only EOS as stop (decode-heavy). Tokens = answer + terminator
   tokens actually generated; batch-1 runs generate the same prompts one call each.

Usage::

    python bench/load_times.py --output bench/results/load_times.json
    python bench/load_times.py --quick --output /tmp/load_times.json   # cached load only
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common

CHILD = """
import json, sys, time
t0 = time.perf_counter()
from gnll import GenerationConfig, load_model
import gnll.backends.hf  # torch + transformers: imported by load_model anyway, timed apart
t1 = time.perf_counter()
model = load_model(sys.argv[1], progress=False)
t2 = time.perf_counter()
model.generate(["What is the capital of France?"], GenerationConfig.greedy(max_new_tokens=4))
t3 = time.perf_counter()
print(json.dumps({"import_s": t1 - t0, "load_s": t2 - t1, "first_generate_s": t3 - t2}))
"""

STORY_TOPICS = [
    "a dragon who learns to bake bread",
    "a lighthouse keeper on a stormy night",
    "the first city on Mars",
    "a detective who is a cat",
    "a river that flows uphill",
    "an orchestra of robots",
    "a library that never closes",
    "a boy who can talk to trees",
]


def child_load(name: str, cache: Path, log: Path) -> dict[str, Any]:
    res = common.run_measured(
        [sys.executable, "-c", CHILD, name], env={"GNLL_CACHE": str(cache)}, log=log
    )
    if res["returncode"] != 0:
        raise RuntimeError(f"loading {name} failed:\n{log.read_text()[-2000:]}")
    last = [ln for ln in log.read_text().splitlines() if ln.startswith("{")][-1]
    res.update(json.loads(last))
    return res


def default_cache() -> Path:
    out = subprocess.run(
        [sys.executable, "-c", "from gnll._util import cache_dir; print(cache_dir())"],
        capture_output=True,
        text=True,
        check=True,
    )
    return Path(out.stdout.strip())


def tokens_per_second(model: Any, quick: bool, repeats: int) -> list[dict[str, Any]]:
    from gnll import GenerationConfig

    n16 = 2 if quick else 16
    n1 = 2 if quick else 8
    max_story = 8 if quick else 64
    workloads = {
        "triviaqa_short": (common.triviaqa_prompts(n16), GenerationConfig.greedy()),
        "open-ended, <= 64 tokens": (
            [f"Write a long story about {t}." for t in (STORY_TOPICS * 2)[:n16]],
            GenerationConfig.greedy(max_new_tokens=max_story, stop=()),
        ),
    }
    rows = []
    for label, (prompts, cfg) in workloads.items():

        def batch1(prompts: list[str] = prompts[:n1], cfg: Any = cfg) -> int:
            return sum(_tokens(model.generate([p], cfg, batch_size=1)) for p in prompts)

        def batch16(prompts: list[str] = prompts, cfg: Any = cfg) -> int:
            return _tokens(model.generate(prompts, cfg, batch_size=16))

        toks = {"batch 1": batch1(), "batch 16": batch16()}  # warm-up, and token counts
        timed = common.interleave({"batch 1": batch1, "batch 16": batch16}, repeats, warmup=0)
        for arm in ("batch 1", "batch 16"):
            rows.append(
                {
                    "workload": label,
                    "batch": arm,
                    "prompts": n1 if arm == "batch 1" else n16,
                    "tokens": toks[arm],
                    "median s": timed[arm]["median_s"],
                    "tokens/s": toks[arm] / timed[arm]["median_s"],
                    "load 1-min": statistics.median(timed[arm]["load_1min"]),
                }
            )
    return rows


def _tokens(gens: list[list[Any]]) -> int:
    return sum(len(g.token_ids) + len(g.terminator_token_ids) for gs in gens for g in gs)


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--skip-first-load", action="store_true", help="no GGUF conversion")
    args = ap.parse_args()
    common.setup_threads(args.threads)
    info = common.machine()
    from gnll.backends.registry import DEFAULT_MODEL, EMBEDDED_MODELS

    repeats = args.repeats or (1 if args.quick else 3)
    names = [DEFAULT_MODEL] if args.quick else list(EMBEDDED_MODELS)
    load_rows = []
    raw: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="gnll-load-") as tmp:
        for name in names:
            if args.quick or args.skip_first_load:
                cache, first = default_cache(), None
            else:
                cache = Path(tmp) / f"cache-{name}"
                first = child_load(name, cache, Path(tmp) / f"{name}-first.log")
            cached = [
                child_load(name, cache, Path(tmp) / f"{name}-cached{i}.log") for i in range(repeats)
            ]
            raw[name] = {"first": first, "cached": cached}
            load_rows.append(
                {
                    "model": name,
                    "first load s (convert)": first["load_s"] if first else "skipped",
                    "first process wall s": first["wall_s"] if first else "skipped",
                    "first generate s (first use)": first["first_generate_s"]
                    if first
                    else "skipped",
                    "cached load s": statistics.median(c["load_s"] for c in cached),
                    "cached process wall s": statistics.median(c["wall_s"] for c in cached),
                    "import torch+transformers s": statistics.median(c["import_s"] for c in cached),
                    "peak RSS MB (first/cached)": (
                        f"{first['peak_rss_mb']:.0f}/" if first else "-/"
                    )
                    + f"{statistics.median(c['peak_rss_mb'] for c in cached):.0f}",
                    "load 1-min": cached[0]["load_before"][0],
                }
            )
            print(f"  {name}: done", flush=True)
    from gnll import load_model

    t = time.perf_counter()
    model = load_model(DEFAULT_MODEL, progress=False)
    in_process_load = time.perf_counter() - t
    tps = tokens_per_second(model, args.quick, repeats)
    print(common.table(load_rows))
    print()
    print(common.table(tps))
    info["peak_rss_mb"] = common.peak_rss_mb()
    common.finish(
        "load_times",
        args,
        {
            "repeats": repeats,
            "loads": load_rows,
            "tokens_per_second": tps,
            "in_process_cached_load_s": in_process_load,
            "raw": raw,
        },
        info,
    )


if __name__ == "__main__":
    main()
