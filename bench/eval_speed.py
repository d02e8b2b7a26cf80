"""The whole default ``gnll eval`` per question: today's code against the code issue 17 was filed on.

Every arm runs ``gnll eval --model M --tasks triviaqa_short --limit N`` with every default (all
measures, 10 samples, 5 beams, the temperature chosen on held-out questions, the default clusterer)
as a separate process, on the same questions:

- ``after``: this checkout, defaults (beam search in gnll's loop, continuous batching);
- ``options``: this checkout with ``--model_args beam_decoder=generate,continuous_batching=false``
  (transformers' beam search, fixed batches): the decoding of before, the rest of today's pipeline;
- ``shared``: this checkout with ``--temperature_selection shared``: one temperature per task, as
  the filed code chose it, so it samples the evaluation pool at one temperature like ``filed``
  does. Today's default (issue 16.3) samples it at every temperature some measure chose: more
  sampling, not slower code. ``--arms shared,filed`` compares the two at equal work;
- ``filed``: the source tree of ``--filed-commit`` (default ``1066f18``, the head when issue 17 was
  filed: beam search in transformers' ``generate``, fixed batches), exported with ``git archive`` and
  run with its own ``src`` first on ``PYTHONPATH``. Its protocol defaults differ in places that do
  not change the work done (temperature chosen once per task, SE estimator, F1 rule) and its
  samples are seeded differently, so only its greedy answers and beams are compared.

Reported: wall time end to end and per stage (``timings.json``), seconds per question, and whether
the outputs are identical (``after`` vs ``options``: greedy answers, beams, samples, temperatures,
measures; ``after`` vs ``filed``: greedy answers and beams). Target (issue 17.3c): ``after`` at least
2x faster per question than ``filed``. The first arm of ``--arms`` (``after`` or ``shared``) is the
one the others are compared with.

``--parallel`` runs the arms of a repetition at the same time, one thread each (both cores busy, each
arm slowed alike): half the wall time of running them one after another.

Usage::

    python bench/eval_speed.py --n 200 --parallel --output bench/results/eval_speed.json
    python bench/eval_speed.py --n 200 --arms shared,filed --parallel \
        --output bench/results/eval_speed_equal_work.json
    python bench/eval_speed.py --quick

``--keep DIR`` keeps each arm's run directory (``results.json``, ``table.md``, ``samples.jsonl``): the
``after`` arm is the default protocol on the model's first 200 TriviaQA questions.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import common

ARGS = {
    "after": None,
    "shared": None,
    "options": "beam_decoder=generate,continuous_batching=false",
    "filed": None,
}
#: Evaluation options besides ``--model_args``, per arm.
FLAGS = {"shared": ["--temperature_selection", "shared"]}


def export_commit(commit: str, dest: Path) -> Path:
    """``src`` of ``commit`` (from this repository) under ``dest``."""
    repo = Path(__file__).resolve().parent.parent
    archive = subprocess.run(
        ["git", "-C", str(repo), "archive", commit, "src"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest / "src"


def eval_command(arm: str, n: int, heldout: int, model: str, out: Path) -> list[str]:
    model_args = ["--model_args", ARGS[arm]] if ARGS[arm] else []
    return [
        *common.gnll_cli(),
        "eval",
        "--model",
        model,
        *model_args,
        "--tasks",
        "triviaqa_short",
        "--limit",
        str(n),
        "--heldout_size",
        str(heldout),
        "--output_path",
        str(out),
        "--no-progress",
        "--no-plots",
        *FLAGS.get(arm, []),
    ]


def collect(arm: str, res: dict[str, Any], workdir: Path) -> dict[str, Any]:
    out = workdir / "run"
    if res["returncode"] != 0:
        raise RuntimeError(f"{arm} failed: {(workdir / 'eval.log').read_text()[-2000:]}")
    res["stage_seconds"] = json.loads((out / "timings.json").read_text())["seconds"]
    res["records"] = [
        {
            "id": r["id"],
            "greedy": r["greedy"]["token_ids"],
            "beams": [b["token_ids"] for b in r.get("beams", [])],
            "samples": [s["token_ids"] for s in r.get("samples", [])],
            "temperature": r.get("temperature"),
            "measures": r["measures"],
        }
        for r in map(json.loads, (out / "samples.jsonl").open(encoding="utf-8"))
    ]
    return res


def identical(
    a: list[dict], b: list[dict], keys=("greedy", "beams", "samples", "temperature"), measures=True
) -> dict[str, Any]:
    by_id = {r["id"]: r for r in b}
    pairs = [(x, by_id[x["id"]]) for x in a if x["id"] in by_id]
    a, b = [x for x, _ in pairs], [y for _, y in pairs]
    out: dict[str, Any] = {"n": len(a)}
    for key in keys:
        out[f"same_{key}"] = sum(x[key] == y[key] for x, y in zip(a, b, strict=True))
    if not measures:
        return out
    diffs = [
        abs(x["measures"][m] - y["measures"][m])
        for x, y in zip(a, b, strict=True)
        for m in x["measures"]
        if x["measures"][m] is not None and y["measures"].get(m) is not None
    ]
    out["max_abs_measure_diff"] = max(diffs, default=0.0)
    return out


def run_arms(
    arms: list[str], rep: int, args: Any, n: int, heldout: int, tmp: Path, filed_src: Path | None
) -> dict[str, dict[str, Any]]:
    """One repetition of every arm: in turn (order alternating per repetition) or all at once."""
    order = arms if rep % 2 == 0 else arms[::-1]
    jobs = {}
    for arm in order:
        wd = tmp / f"{arm}{rep}"
        wd.mkdir()
        env = {}
        if arm == "filed":
            env["PYTHONPATH"] = os.pathsep.join([str(filed_src), os.environ.get("PYTHONPATH", "")])
        threads = args.threads or (1 if args.parallel else None)
        if threads:
            env["OMP_NUM_THREADS"] = str(threads)
        cmd = eval_command(arm, n, heldout, args.model, wd / "run")
        jobs[arm] = (wd, cmd, env)
    if args.parallel:
        from concurrent.futures import ThreadPoolExecutor

        with ThreadPoolExecutor(len(jobs)) as pool:
            futs = {
                arm: pool.submit(common.run_measured, cmd, env=env, log=wd / "eval.log")
                for arm, (wd, cmd, env) in jobs.items()
            }
            results = {arm: f.result() for arm, f in futs.items()}
    else:
        results = {
            arm: common.run_measured(cmd, env=env, log=wd / "eval.log")
            for arm, (wd, cmd, env) in jobs.items()
        }
    return {arm: collect(arm, results[arm], jobs[arm][0]) for arm in arms}


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--n", type=int, default=None, help="questions (default 200; quick 3)")
    ap.add_argument(
        "--heldout", type=int, default=None, help="held-out questions (default min(n, 100))"
    )
    ap.add_argument("--repeats", type=int, default=None, help="default 1")
    ap.add_argument("--model", default=common.DEFAULT_MODEL)
    ap.add_argument("--arms", default="after,options,filed", help="comma-separated arms")
    ap.add_argument("--filed-commit", default="1066f18", help="the 'filed' arm's commit")
    ap.add_argument("--parallel", action="store_true", help="run a repetition's arms at once")
    ap.add_argument(
        "--keep", type=Path, default=None, help="copy every arm's run directory (ARM REP) here"
    )
    args = ap.parse_args()
    n = args.n or (3 if args.quick else 200)
    heldout = args.heldout or min(n, 100)
    arms = [a for a in args.arms.split(",") if a]
    if not arms or arms[0] not in ("after", "shared") or any(a not in ARGS for a in arms):
        raise SystemExit(f"--arms: 'after' or 'shared' first, then any of {', '.join(ARGS)}")
    ref = arms[0]
    info = common.machine()
    runs: dict[str, list[dict[str, Any]]] = {a: [] for a in arms}
    with tempfile.TemporaryDirectory(prefix="gnll-eval-speed-") as tmp:
        filed_src = export_commit(args.filed_commit, Path(tmp)) if "filed" in arms else None
        for rep in range(args.repeats or 1):
            for arm, res in run_arms(arms, rep, args, n, heldout, Path(tmp), filed_src).items():
                runs[arm].append(res)
                print(f"  {arm} rep {rep}: {res['wall_s']:.1f} s", flush=True)
                if args.keep:
                    shutil.copytree(Path(tmp) / f"{arm}{rep}", args.keep / f"{arm}{rep}")
    reference = runs[ref][0]["records"]
    same = {}
    if "options" in runs:
        same["options"] = identical(reference, runs["options"][0]["records"])
    if "filed" in runs:
        same["filed"] = identical(
            reference, runs["filed"][0]["records"], keys=("greedy", "beams"), measures=False
        )
    for arm in runs.values():
        for r in arm:
            r.pop("records")
    rows = []
    for arm in arms:
        wall = statistics.median(r["wall_s"] for r in runs[arm])
        stages = runs[arm][0]["stage_seconds"]
        rows.append(
            {
                "arm": arm,
                "questions": n,
                "held-out": heldout,
                "wall s": wall,
                "s/question": wall / n,
                "beams s": sum(v for k, v in stages.items() if k.startswith("beams")),
                "samples s": sum(v for k, v in stages.items() if k.startswith("samples")),
                "greedy s": stages.get("greedy", float("nan")),
                "peak RSS MB": max(r["peak_rss_mb"] for r in runs[arm]),
                "load 1-min": statistics.median(r["load_before"][0] for r in runs[arm]),
            }
        )
    by_arm = {r["arm"]: r for r in rows}
    speedups = {
        arm: [b["wall_s"] / a["wall_s"] for a, b in zip(runs[ref], runs[arm], strict=True)]
        for arm in arms
        if arm != ref
    }
    stage = {
        arm: {
            k: by_arm[arm][k] / by_arm[ref][k] if by_arm[ref][k] else float("nan")
            for k in ("beams s", "samples s", "greedy s")
        }
        for arm in speedups
    }
    baseline = "filed" if "filed" in speedups else next(iter(speedups), None)
    median = statistics.median(speedups[baseline]) if baseline else float("nan")
    summary = {
        "reference": ref,
        "baseline": baseline,
        "speedup_median": median,
        "speedups": speedups,
        "stage_speedups": stage,
        "target": 2.0,
        "met": median >= 2.0,
        "identical": same,
    }
    print(common.table(rows))
    for arm, ratios in speedups.items():
        st = ", ".join(f"{k.split()[0]} {v:.2f}x" for k, v in stage[arm].items())
        print(f"\n{ref} vs {arm}: {statistics.median(ratios):.2f}x per question ({st})")
    for arm, sm in same.items():
        print(f"identical with {arm}: " + ", ".join(f"{k} {v}" for k, v in sm.items()))
    print(f"target ({ref} vs {baseline}) >= 2x: {'met' if summary['met'] else 'NOT met'}")
    common.finish(
        "eval_speed", args, {"n": n, "table": rows, "summary": summary, "runs": runs}, info
    )


if __name__ == "__main__":
    main()
