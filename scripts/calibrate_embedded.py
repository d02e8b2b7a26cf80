"""Regenerate the calibration files shipped for the embedded models (src/gnll/calibration/shipped/).

For each embedded model: the first LIMIT questions of the eval split of each short-answer task
(TriviaQA, SVAMP, NQ-Open, the full files, split as `gnll eval` splits them) are asked
*exactly as `gnll ask` asks them* (zero-shot, the same instruction and chat template, greedy, 50 new
tokens), each answer is labelled correct when a gold answer occurs in it (``contains``: asked this
way the models answer in sentences, for which the short tasks' F1 > 0.5 is almost never met; the
paper uses the same match for sentence answers), and `gnll calibrate` is run on the resulting
scored file (columns question, answer, g_nll, correct). So
the shipped files match `gnll ask` and `gnll score` rows with a ``question`` field, and their prompt
fingerprint says so.

Empty answers (the model stopped at once) are kept, labelled wrong, with the G-NLL every gnll
surface gives them: their stop token's log-prob (``Generation.measured_logprobs``). The files'
default abstention rule is the accuracy rule where its target is reachable, else the coverage rule
(answer the most certain 80%); the file states which and why (``default_rule``).

    OMP_NUM_THREADS=1 python scripts/calibrate_embedded.py [--limit 100] [--data_dir DIR]

Greedy decoding only (no beams, no samples): a few minutes of CPU per model.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from gnll import GenerationConfig, load_model
from gnll import measures as M
from gnll.calibration import calibrate_files, prompt_fingerprint
from gnll.calibration.plot import reliability_diagram
from gnll.evaluation.data.prompts import ask_prompt
from gnll.evaluation.data.tasks import get_task
from gnll.evaluation.results.correctness import contains_match, f1_verdict

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("smollm2-135m-instruct", "gemma-3-270m")
TASKS = ("triviaqa_short", "svamp_short", "nq_open_short")


def scored_file(model_name: str, limit: int, data_dir: str, out: Path) -> Path:
    """Ask every question the `gnll ask` way and write question, answer, g_nll, correct per row."""
    if out.exists():
        print(f"{out} exists, reusing it (delete it to regenerate)")
        return out
    lm = load_model(model_name, progress=False)
    rows = []
    for name in TASKS:
        td = get_task(name).load(data_dir=data_dir)
        examples = td.split("eval", limit)
        # SVAMP: the problem body and the question, as `gnll ask` would be asked it.
        questions = [td.task.judge_question(ex) for ex in examples]
        t0 = time.perf_counter()
        gens = lm.generate(
            [ask_prompt(q, long=False) for q in questions],
            GenerationConfig.greedy(max_new_tokens=50),
        )
        print(f"{model_name} {name}: {len(examples)} questions in {time.perf_counter() - t0:.0f} s")
        for ex, q, [g] in zip(examples, questions, gens, strict=True):
            rows.append(
                {
                    "task": name,
                    "id": ex.id,
                    "question": q,
                    "answer": g.text,
                    "g_nll": M.g_nll(g),  # an empty answer: its stop token's log-prob
                    "num_tokens": g.num_tokens,
                }
            )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(
        "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8"
    )
    return out


def label_rows(path: Path, limit: int, data_dir: str) -> tuple[Path, int]:
    """Add ``correct`` (contains) and ``correct_f1`` to the generated rows, from the tasks' gold answers.

    Empty answers are kept and are wrong (no gold answer occurs in them); they carry their stop
    token's G-NLL, as `gnll ask` and `gnll serve` report it. Their count is recorded.
    """
    gold = {}
    for name in TASKS:
        td = get_task(name).load(data_dir=data_dir)
        gold.update({(name, ex.id): ex for ex in td.split("eval", limit)})
    out = path.with_suffix(".labelled.jsonl")
    empty = 0
    with path.open(encoding="utf-8") as fh, out.open("w", encoding="utf-8") as w:
        for line in fh:
            r = json.loads(line)
            empty += not r["answer"].strip()
            ex = gold[(r["task"], r["id"])]
            r["correct"] = contains_match(r["answer"], ex.answers, ex.numeric_answer).correct
            r["correct_f1"] = f1_verdict(r["answer"], ex.answers, ex.numeric_answer).correct
            w.write(json.dumps(r, ensure_ascii=False) + "\n")
    return out, empty


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--limit", type=int, default=100, help="questions per task (eval split)")
    ap.add_argument(
        "--data_dir",
        default=os.environ.get("GNLL_DATA_DIR"),
        help="the folder of the full data files (default $GNLL_DATA_DIR; without it the shipped "
        "sample, whose first 200 evaluation questions per task are the full files')",
    )
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument(
        "--work", default=str(ROOT / "runs" / "calibration"), help="scored files go here"
    )
    args = ap.parse_args()
    shipped = ROOT / "src" / "gnll" / "calibration" / "shipped"
    figures = ROOT / "docs" / "figures"
    for model_name in args.models.split(","):
        raw = scored_file(
            model_name, args.limit, args.data_dir, Path(args.work) / f"{model_name}.jsonl"
        )
        data, empty = label_rows(raw, args.limit, args.data_dir)
        cal, labelled = calibrate_files([data], measure="g-nll", model=model_name)
        cal.meta["prompt_fingerprint"] = prompt_fingerprint(ask_prompt("{question}", long=False))
        cal.meta["prompt_format"] = "instruction"
        cal.meta["prompt_description"] = "gnll ask (zero-shot, short-answer instruction)"
        cal.meta["data"]["description"] = (
            f"first {args.limit} eval-split questions of each of {', '.join(TASKS)} (bundled data), "
            "asked as gnll ask asks them; correct = a gold answer occurs in the answer (contains; "
            "numeric equality for SVAMP)"
        )
        cal.meta["data"]["empty_answers"] = (
            f"{empty} empty answers kept, labelled wrong, G-NLL = their stop token's"
        )
        cal.meta["data"]["sources"] = [
            {**s, "path": Path(s["path"]).name} for s in cal.meta["data"]["sources"]
        ]
        cal.meta["regenerate"] = "python scripts/calibrate_embedded.py"
        cal.save(shipped / f"{model_name}.json")
        m = cal.heldout_metrics
        reliability_diagram(
            cal.heldout_["p"],
            cal.heldout_["y"],
            figures / f"calibration-{model_name}.png",
            metrics=m,
            title=f"{model_name}: G-NLL -> P(correct) ({cal.method_}), held-out folds, n={len(labelled.scores)}",
        )
        print(
            f"{model_name}: {cal.method_}, n={m['n']} ({empty} empty answers), accuracy={m['accuracy']:.3f}, "
            f"held-out ECE={m['ece']:.3f} ({m['ece_binning']}), Brier={m['brier']:.3f}, "
            f"AUROC={m['auroc']:.3f}"
        )


if __name__ == "__main__":
    main()
