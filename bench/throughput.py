"""Benchmark 3 -- pipeline throughput: ``gnll eval`` (G-NLL only) vs one question at a time.

- ``eval``: ``gnll eval --model M --tasks triviaqa_short --limit N --measures g-nll`` as a user runs
  it (a child process; batched, length-sorted, shared few-shot prefix computed once per chunk,
  finished rows dropped, records streamed to disk).
- ``loop``: a child process that loads the same model and, for the same N prompts, calls
  ``model.generate([prompt])`` once per question and computes G-NLL -- the way the reference
  implementations run (one prompt per ``generate``). Same scoring code, only batching differs.
- ``transformers``: the loop a user would write with plain transformers and no gnll (a child
  process): load the same checkpoint with ``AutoModelForCausalLM``, render the same prompts with the
  tokenizer's chat template, and in order, 16 at a time (left padding), call
  ``model.generate(max_new_tokens=50, output_scores=True, return_dict_in_generate=True)`` with every
  vocabulary token that contains a newline (or ``Question:`` / ``Context:``) as an EOS id; the
  answer is the tokens before the first stop, G-NLL ``-sum`` of
  ``compute_transition_scores(..., normalize_logits=True)`` over them.

All arms run as separate processes, interleaved, and are reported end to end (process start to
exit, model load included) and generation-only (eval: the ``greedy`` stage of its ``timings.json``;
loop and transformers: the loop itself). Targets: eval >= 5x the one-at-a-time loop and >= 3x the
plain-transformers loop (issue 17), in questions/second end to end. The answers of every arm are
compared with eval's (same text, G-NLL within 1e-3), and the transformers arm's rendered prompts
with the ``prompt`` field of eval's ``samples.jsonl``, so a speed-up is not bought with different
inputs or outputs.

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


def transformers_worker(n: int, model_name: str, out: Path, batch_size: int = 16) -> None:
    """The plain-transformers loop (runs in its own process); gnll only supplies the prompt texts
    and the checkpoint directory (an embedded model is a converted GGUF file)."""
    t0 = time.perf_counter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from gnll.backends.registry import EMBEDDED_MODELS, embedded_model_dir

    spec = EMBEDDED_MODELS.get(model_name)
    path = str(embedded_model_dir(spec, progress=False)) if spec else model_name
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    chat = bool(spec.instruction_tuned if spec else tok.chat_template)
    load_s = time.perf_counter() - t0
    prompts = common.triviaqa_prompts(n)
    t = time.perf_counter()
    if chat:
        texts = [
            tok.apply_chat_template(
                [{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False
            )
            for p in prompts
        ]
    else:
        texts = list(prompts)
    # Newline tokens (and the few-shot markers) as EOS: every vocabulary entry containing one.
    vocab_text = tok.batch_decode([[i] for i in range(len(tok))])
    stops = sorted(
        {
            i
            for i, v in enumerate(vocab_text)
            if any(s in v for s in ("\n", "Question:", "Context:"))
        }
        | {tok.eos_token_id}
    )
    stop_set = set(stops)
    tok.padding_side = "left"
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    records = []
    with torch.inference_mode():
        for s in range(0, len(texts), batch_size):
            enc = tok(
                texts[s : s + batch_size],
                return_tensors="pt",
                padding=True,
                add_special_tokens=not chat,
            )
            res = model.generate(
                **enc,
                max_new_tokens=50,
                do_sample=False,
                eos_token_id=stops,
                pad_token_id=tok.pad_token_id,
                output_scores=True,
                return_dict_in_generate=True,
            )
            lp = model.compute_transition_scores(res.sequences, res.scores, normalize_logits=True)
            new = res.sequences[:, enc["input_ids"].shape[1] :].tolist()
            for row, lps in zip(new, lp.tolist(), strict=True):
                end = next((j for j, i in enumerate(row) if i in stop_set), len(row))
                records.append(
                    {
                        "text": tok.decode(row[:end], skip_special_tokens=True).strip(),
                        "g_nll": -sum(lps[:end]),
                    }
                )
    gen_s = time.perf_counter() - t
    out.write_text(
        json.dumps({"load_s": load_s, "gen_s": gen_s, "records": records, "prompts": texts})
    )


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
        {"text": r["greedy"]["text"], "g_nll": r["measures"]["g-nll"], "prompt": r["prompt"]}
        # Iterate the file, not str.splitlines(): answers may contain U+2028 or U+0085, which
        # splitlines() treats as line breaks but JSON Lines (and ensure_ascii=False) does not.
        for r in map(json.loads, (out / "samples.jsonl").open(encoding="utf-8"))
    ]
    return res


def run_worker(arm: str, n: int, model: str, workdir: Path) -> dict[str, Any]:
    """Run the ``loop`` or ``transformers`` arm in a child process."""
    out = workdir / f"{arm}.json"
    cmd = [sys.executable, str(Path(__file__).resolve()), f"--{arm}-worker", str(out)]
    res = common.run_measured([*cmd, "--n", str(n), "--model", model], log=workdir / f"{arm}.log")
    if res["returncode"] != 0:
        raise RuntimeError(f"{arm} failed: {(workdir / f'{arm}.log').read_text()[-2000:]}")
    data = json.loads(out.read_text())
    res.update(gen_s=data["gen_s"], load_s=data["load_s"], records=data["records"])
    if "prompts" in data:
        res["prompts"] = data["prompts"]
    return res


def agreement(a: list[dict], b: list[dict]) -> dict[str, Any]:
    same = sum(x["text"] == y["text"] for x, y in zip(a, b, strict=True))
    diffs = [
        abs(x["g_nll"] - y["g_nll"]) for x, y in zip(a, b, strict=True) if x["text"] == y["text"]
    ]
    return {"same_text": same, "n": len(a), "max_abs_g_nll_diff": max(diffs, default=0.0)}


#: Target ratio of eval's end-to-end questions/second over each baseline arm.
TARGETS = {"loop": 5.0, "transformers": 3.0}


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--n", type=int, default=None, help="questions (default 200; quick 2)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--model", default=common.DEFAULT_MODEL)
    ap.add_argument(
        "--arms",
        default="eval,loop,transformers",
        help="comma list of eval, eval-chunk64 (eval with --chunk_size 64), loop, transformers",
    )
    ap.add_argument("--loop-worker", type=Path, default=None, help=argparse_hidden())
    ap.add_argument("--transformers-worker", type=Path, default=None, help=argparse_hidden())
    args = ap.parse_args()
    n = args.n or (2 if args.quick else 200)
    if args.loop_worker or args.transformers_worker:
        common.setup_threads(args.threads)
        if args.loop_worker:
            loop_worker(n, args.model, args.loop_worker)
        else:
            transformers_worker(n, args.model, args.transformers_worker)
        return
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the children inherit it
    arms = [a.strip() for a in args.arms.split(",") if a.strip()]
    if "eval" not in arms or not set(arms) <= {"eval", "eval-chunk64", *TARGETS}:
        ap.error("--arms must include eval and may add eval-chunk64, loop and transformers")
    info = common.machine()
    repeats = args.repeats or (1 if args.quick else 3)
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory(prefix="gnll-throughput-") as tmp:
        for rep in range(repeats):
            order = arms if rep % 2 == 0 else arms[::-1]
            for arm in order:
                wd = Path(tmp) / f"{arm}{rep}"
                wd.mkdir()
                if arm.startswith("eval"):
                    # Quick runs skip the PNGs (matplotlib start-up dominates a 2-question run).
                    extra = ["--no-plots"] if args.quick else []
                    if arm == "eval-chunk64":  # the chunk size before continuous batching
                        extra += ["--chunk_size", "64"]
                    res = run_eval(n, args.model, wd, extra)
                else:
                    res = run_worker(arm, n, args.model, wd)
                runs[arm].append(res)
                print(f"  {arm} rep {rep}: {runs[arm][-1]['wall_s']:.1f} s", flush=True)
    ref = runs["eval"][0]["records"]
    agree = {a: agreement(ref, runs[a][0]["records"]) for a in arms if a != "eval"}
    if "transformers" in runs:
        rendered = runs["transformers"][0]["prompts"]
        agree["transformers"]["same_prompts"] = sum(
            r["prompt"] == p for r, p in zip(ref, rendered, strict=True)
        )
    for arm in runs.values():
        for r in arm:
            r.pop("records")
            r.pop("prompts", None)

    def med(arm: str, key: str) -> float:
        return statistics.median(r[key] for r in runs[arm])

    rows = []
    for arm in arms:
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
    summary: dict[str, Any] = {"agreement": agree, "targets": TARGETS}
    lines = []
    for base in (a for a in arms if a != "eval"):
        e2e = [b["wall_s"] / e["wall_s"] for e, b in zip(runs["eval"], runs[base], strict=True)]
        gen = [b["gen_s"] / e["gen_s"] for e, b in zip(runs["eval"], runs[base], strict=True)]
        summary[base] = {
            "speedup_end_to_end_median": statistics.median(e2e),
            "speedup_generation_median": statistics.median(gen),
            "speedups_end_to_end": e2e,
            "speedups_generation": gen,
            "target": TARGETS.get(base),
            "met_end_to_end": base in TARGETS and statistics.median(e2e) >= TARGETS[base],
        }
        ag = agree[base]
        lines.append(
            f"speed-up eval/{base}: end-to-end {statistics.median(e2e):.2f}x, generation "
            f"{statistics.median(gen):.2f}x"
            + (f" (target >= {TARGETS[base]:g}x)" if base in TARGETS else "")
            + "; same answers "
            f"{ag['same_text']}/{ag['n']}, max |G-NLL diff| {ag['max_abs_g_nll_diff']:.2g}"
            + (f", same prompts {ag['same_prompts']}/{ag['n']}" if "same_prompts" in ag else "")
        )
    print(common.table(rows))
    print("\n" + "\n".join(lines))
    common.finish(
        "throughput",
        args,
        {"n": n, "repeats": repeats, "arms": arms, "table": rows, "summary": summary, "runs": runs},
        info,
    )


def argparse_hidden() -> str:
    import argparse

    return argparse.SUPPRESS


if __name__ == "__main__":
    main()
