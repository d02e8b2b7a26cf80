"""Record LM-Polygraph's own numbers on the embedded SmolLM2, for gnll's parity test.

    bash scripts/polygraph_fixture.sh          # makes the venv, then runs this file in it

Runs in its own virtual environment (LM-Polygraph's pins clash with gnll's; the venv sees the
shared torch/transformers through ``--system-site-packages``, so both tools run the same model
code). The model is gnll's: the embedded SmolLM2-135M-Instruct loaded by :func:`gnll.load_model`
(the GGUF converted to a transformers model), its ``model`` and ``tokenizer`` handed to
LM-Polygraph's ``WhiteboxModel``; no hub download. Prompts are gnll's TriviaQA few-shot prompts as
plain text (no chat template; LM-Polygraph's ``instruct=False`` tokenises them the same way).

For each question LM-Polygraph's ``GreedyProbsCalculator`` (``min_new_tokens=2``, the stop strings
of gnll's ``DEFAULT_STOP``, newlines allowed) gives the greedy tokens, text and log-likelihoods,
and ``MaximumSequenceProbability`` the MSP. The quality is gnll's F1 > 0.5 verdict on
LM-Polygraph's greedy text. ``PredictionRejectionArea`` (``prr``, ``prr_0.5``) and their
``_normalized`` forms are computed exactly as ``UEManager.eval_ue`` does (oracle: the quality
itself; random: ``get_random_scores``, 1,000 shuffles). Everything goes to
``tests/evaluation/data/polygraph_msp.json``.

``--defaults`` records with LM-Polygraph's own defaults instead (``polygraph_msp_defaults.json``):
``WhiteboxModel(instruct=True)`` (the tokenizer's chat template, each prompt one user turn, as
gnll renders a plain prompt with ``chat_template=True``) and ``GenerationParameters()`` (no stop
strings, so only EOS ends an answer). Its greedy decoding masks EOS in steps 1-2
(``min_new_tokens=2``), so where gnll's unmasked greedy answer ends with EOS at step 1 or 2 the
two tools generate different answers: ``tests/evaluation/test_polygraph_parity.py`` checks
``g-nll+eos`` on the answers that agree and counts those that do not. ``--defaults --multiturn``
gives the few-shot examples as user/assistant turns (``polygraph_msp_multiturn.json``);
``--defaults --prompt TEXT`` (repeatable) records prompts of one's own (``polygraph_msp_prompts.json``),
e.g. yes/no questions whose unmasked greedy answer is one token and EOS.
"""

from __future__ import annotations

import argparse
import json
import time
from importlib.metadata import version
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--limit", type=int, default=40)
    ap.add_argument("--data_dir", default=None)
    ap.add_argument("--defaults", action="store_true", help="LM-Polygraph's defaults (see above)")
    ap.add_argument(
        "--multiturn", action="store_true", help="with --defaults: few-shot examples as chat turns"
    )
    ap.add_argument(
        "--prompt",
        action="append",
        default=None,
        help="with --defaults: record these prompts (quality 0) instead of TriviaQA's",
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.out is None:
        name = "polygraph_msp_defaults.json" if args.defaults else "polygraph_msp.json"
        name = name.replace("defaults", "multiturn") if args.multiturn else name
        name = name.replace("defaults", "prompts") if args.prompt else name
        args.out = f"tests/evaluation/data/{name}"

    from lm_polygraph.estimators import MaximumSequenceProbability
    from lm_polygraph.stat_calculators.greedy_probs import GreedyProbsCalculator
    from lm_polygraph.ue_metrics import PredictionRejectionArea
    from lm_polygraph.ue_metrics.ue_metric import get_random_scores, normalize_metric
    from lm_polygraph.utils.generation_parameters import GenerationParameters
    from lm_polygraph.utils.model import WhiteboxModel

    from gnll import load_model
    from gnll.backends.base import DEFAULT_STOP, chat_messages
    from gnll.evaluation.data.tasks import get_task
    from gnll.evaluation.results.correctness import f1_verdict

    start = time.time()
    lm = load_model(args.model, chat_template=args.defaults, progress=False)
    td = get_task("triviaqa_short").load(data_dir=args.data_dir)
    td.fewshot_as_multiturn = args.multiturn  # td.prompt(e) then carries the chat turns
    examples = td.split("eval", args.limit)
    max_new = td.task.max_new_tokens
    if args.defaults:
        params, stop_strings = GenerationParameters(), None
    else:
        stop_strings = list(DEFAULT_STOP)
        params = GenerationParameters(stop_strings=stop_strings, allow_newlines=True)
    wm = WhiteboxModel(
        lm.model,
        lm.tokenizer,
        model_path=args.model,
        generation_parameters=params,
        instruct=args.defaults,
    )
    # Attentions are not needed for MSP (and sdpa attention does not return them).
    calc = GreedyProbsCalculator(output_attentions=False)
    rows = []
    items = [(str(e.id), td.prompt(e), e) for e in examples]
    if args.prompt:  # prompts of one's own, e.g. ones whose greedy answer ends with EOS at step 2
        items = [(f"p{i}", p, None) for i, p in enumerate(args.prompt)]
    for qid, full, e in items:
        prompt = str(full)  # plain text: with instruct=True, one user turn
        # --multiturn: the few-shot examples as user/assistant turns, as gnll's ChatPrompt
        chat = chat_messages(full) if args.multiturn else prompt
        stats = calc({}, [chat], wm, max_new_tokens=max_new)  # one prompt: no padding
        text = stats["greedy_texts"][0]
        msp = float(MaximumSequenceProbability()(stats)[0])
        correct = e is not None and f1_verdict(text, e.answers, e.numeric_answer).correct
        rows.append(
            {
                "id": qid,
                "prompt": prompt,
                **({"messages": chat} if args.multiturn else {}),
                "input_tokens": [int(t) for t in stats["input_tokens"][0]],
                "greedy_text": text,
                "greedy_tokens": [int(t) for t in stats["greedy_tokens"][0]],
                "greedy_log_likelihoods": [float(x) for x in stats["greedy_log_likelihoods"][0]],
                "msp": msp,
                "quality": float(bool(correct)),
            }
        )
    ue = np.array([r["msp"] for r in rows])
    quality = np.array([r["quality"] for r in rows])
    metrics = {}
    for m in (PredictionRejectionArea(), PredictionRejectionArea(max_rejection=0.5)):
        value = m(ue, quality)
        oracle, random = m(-quality, quality), get_random_scores(m, quality)
        metrics[str(m)] = float(value)
        metrics[f"{m}_normalized"] = float(normalize_metric(value, oracle, random))
    out = {
        "about": "LM-Polygraph's greedy log-likelihoods, MaximumSequenceProbability and PRR "
        "metrics on gnll's embedded model; written by scripts/polygraph_fixture.py",
        "lm_polygraph": version("lm-polygraph"),
        "transformers": version("transformers"),
        "torch": version("torch"),
        "model": args.model,
        "task": "triviaqa_short",
        "max_new_tokens": max_new,
        "stop_strings": stop_strings,
        "instruct": args.defaults,
        "multiturn": args.multiturn,
        "eos_token_id": lm.tokenizer.eos_token_id,
        "min_new_tokens": 2,
        "metrics": metrics,
        "rows": rows,
    }
    Path(args.out).write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {args.out}: {len(rows)} questions, {time.time() - start:.0f} s; {metrics}")


if __name__ == "__main__":
    main()
