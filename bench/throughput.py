"""Benchmark 3 -- pipeline throughput: ``gnll eval`` (G-NLL only) vs one question at a time.

- ``eval``: ``gnll eval --model M --tasks triviaqa_short --limit N --measures g-nll`` as a user runs
  it (a child process; batched, length-sorted, shared few-shot prefix computed once per chunk,
  finished rows dropped, records streamed to disk).
- ``loop``: a child process that loads the same model and, for the same N prompts, calls
  ``model.generate([prompt])`` once per question and computes G-NLL -- the way the reference
  implementations run (one prompt per ``generate``). Same scoring code, only batching differs.

Both arms run as separate processes, interleaved, and are reported end to end (process start to
exit, model load included) and generation-only (eval: the ``greedy`` stage of its ``timings.json``;
loop: the loop itself). Target: eval >= 5x the loop's questions/second. The answers of both arms are
compared (same text, G-NLL within 1e-3) so the speed-up is not bought with different outputs.

Usage::

    python bench/throughput.py --output bench/results/throughput.json
    python bench/throughput.py --quick --output /tmp/throughput.json
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common


def loop_worker(n: int, model_name: str, out: Path) -> None:
    """The one-question-at-a-time baseline (runs in its own process)."""
    t0 = time.perf_counter()
    from gnll import GenerationConfig, load_model, measures

    model = load_model(model_name, progress=False)
    load_s = time.perf_counter() - t0
    prompts = common.triviaqa_prompts(n)
    cfg = GenerationConfig.greedy(max_new_tokens=50)
    records = []
    t = time.perf_counter()
    with (out.parent / "loop.jsonl").open("w") as fh:
        for p in prompts:
            [[g]] = model.generate([p], cfg, batch_size=1)
            rec = {"text": g.text, "g_nll": measures.g_nll(g.token_logprobs)}
            fh.write(json.dumps(rec) + "\n")
            records.append(rec)
    gen_s = time.perf_counter() - t
    out.write_text(json.dumps({"load_s": load_s, "gen_s": gen_s, "records": records}))


def run_eval(n: int, model: str, workdir: Path, extra: list[str] | None = None) -> dict[str, Any]:
    out = workdir / "eval"
    cmd = [
        *common.gnll_cli(),
        "eval",
        "--model",
        model,
        "--tasks",
        "triviaqa_short",
        "--limit",
        str(n),
        "--measures",
        "g-nll",
        "--output_path",
        str(out),
        "--no-progress",
        *(extra or []),
    ]
    res = common.run_measured(cmd, log=workdir / "eval.log")
    if res["returncode"] != 0:
        raise RuntimeError(f"gnll eval failed: {(workdir / 'eval.log').read_text()[-2000:]}")
    timings = json.loads((out / "timings.json").read_text())["seconds"]
    # The model is loaded lazily inside the first greedy chunk, so the greedy stage includes the
    # load; subtract it to get generation time.
    res["gen_s"] = timings.get("greedy", float("nan")) - timings.get("load_model", 0.0)
    res["stage_seconds"] = timings
    res["records"] = [
        {"text": r["greedy"]["text"], "g_nll": r["measures"]["g-nll"]}
        # Iterate the file, not str.splitlines(): answers may contain U+2028 or U+0085, which
        # splitlines() treats as line breaks but JSON Lines (and ensure_ascii=False) does not.
        for r in map(json.loads, (out / "samples.jsonl").open(encoding="utf-8"))
    ]
    return res


def run_loop(n: int, model: str, workdir: Path) -> dict[str, Any]:
    out = workdir / "loop.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), "--loop-worker", str(out), "--n", str(n)]
    res = common.run_measured([*cmd, "--model", model], log=workdir / "loop.log")
    if res["returncode"] != 0:
        raise RuntimeError(f"loop failed: {(workdir / 'loop.log').read_text()[-2000:]}")
    data = json.loads(out.read_text())
    res.update(gen_s=data["gen_s"], load_s=data["load_s"], records=data["records"])
    return res


def agreement(a: list[dict], b: list[dict]) -> dict[str, Any]:
    same = sum(x["text"] == y["text"] for x, y in zip(a, b, strict=True))
    diffs = [
        abs(x["g_nll"] - y["g_nll"]) for x, y in zip(a, b, strict=True) if x["text"] == y["text"]
    ]
    return {"same_text": same, "n": len(a), "max_abs_g_nll_diff": max(diffs, default=0.0)}


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--n", type=int, default=None, help="questions (default 200; quick 2)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--model", default=common.DEFAULT_MODEL)
    ap.add_argument("--loop-worker", type=Path, default=None, help=argparse_hidden())
    args = ap.parse_args()
    n = args.n or (2 if args.quick else 200)
    if args.loop_worker:
        common.setup_threads(args.threads)
        loop_worker(n, args.model, args.loop_worker)
        return
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the children inherit it
    info = common.machine()
    repeats = args.repeats or (1 if args.quick else 3)
    runs: dict[str, list[dict[str, Any]]] = {"eval": [], "loop": []}
    with tempfile.TemporaryDirectory(prefix="gnll-throughput-") as tmp:
        for rep in range(repeats):
            order = ["eval", "loop"] if rep % 2 == 0 else ["loop", "eval"]
            for arm in order:
                wd = Path(tmp) / f"{arm}{rep}"
                wd.mkdir()
                if arm == "eval":
                    # Quick runs skip the PNGs (matplotlib start-up dominates a 2-question run).
                    res = run_eval(n, args.model, wd, ["--no-plots"] if args.quick else None)
                else:
                    res = run_loop(n, args.model, wd)
                runs[arm].append(res)
                print(f"  {arm} rep {rep}: {runs[arm][-1]['wall_s']:.1f} s", flush=True)
    agree = agreement(runs["eval"][0]["records"], runs["loop"][0]["records"])
    for arm in runs.values():
        for r in arm:
            r.pop("records")

    def med(arm: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[arm])

    rows = []
    for arm in ("eval", "loop"):
        rows.append(
            {
                "arm": arm,
                "questions": n,
                "wall s": med(arm, "wall_s"),
                "q/s end-to-end": n / med(arm, "wall_s"),
                "generation s": med(arm, "gen_s"),
                "q/s generation": n / med(arm, "gen_s"),
                "peak RSS MB": med(arm, "peak_rss_mb"),
                "load 1-min": statistics.median(r["load_before"][0] for r in runs[arm]),
            }
        )
    speedup_e2e = [
        r["wall_s"] / e["wall_s"] for e, r in zip(runs["eval"], runs["loop"], strict=True)
    ]
    speedup_gen = [r["gen_s"] / e["gen_s"] for e, r in zip(runs["eval"], runs["loop"], strict=True)]
    summary = {
        "speedup_end_to_end_median": statistics.median(speedup_e2e),
        "speedup_generation_median": statistics.median(speedup_gen),
        "speedups_end_to_end": speedup_e2e,
        "speedups_generation": speedup_gen,
        "target": ">= 5x questions/second",
        "met_end_to_end": statistics.median(speedup_e2e) >= 5,
        "met_generation": statistics.median(speedup_gen) >= 5,
        "agreement_eval_vs_loop": agree,
    }
    print(common.table(rows))
    print(
        f"\nspeed-up eval/loop: end-to-end {summary['speedup_end_to_end_median']:.2f}x, "
        f"generation {summary['speedup_generation_median']:.2f}x (target >= 5x); "
        f"same answers {agree['same_text']}/{agree['n']}, "
        f"max |G-NLL diff| {agree['max_abs_g_nll_diff']:.2g}"
    )
    common.finish(
        "throughput",
        args,
        {"n": n, "repeats": repeats, "table": rows, "summary": summary, "runs": runs},
        info,
    )


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
