"""Cutting an answer at its stop string: ``StopRules.split`` now vs decoding every prefix (before).

The former ``split`` found the answer's last token by decoding ``body[:k]`` for growing ``k``:
time quadratic in the answer's length. The oracle of ``tests/backends/test_backend_stopping.py`` keeps that
implementation; both arms split the same answers (TriviaQA questions run together, cut to ``n``
tokens, ending in "Question:") with the embedded models' tokenizers, interleaved in one run.

Usage::

    python bench/stop_split.py --output bench/results/stop_split.json
    python bench/stop_split.py --quick --output /tmp/stop_split.json
"""

from __future__ import annotations

import sys
from functools import partial
from pathlib import Path

import common
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "backends"))


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--repeats", type=int, default=None)
    args = ap.parse_args()
    info = common.machine()
    from test_backend_stopping import reference_split

    from gnll import GenerationConfig
    from gnll.backends.hf.loading import load_tokenizer_json
    from gnll.backends.hf.stopping import StopRules
    from gnll.backends.registry import DEFAULT_MODEL, EMBEDDED_MODELS, embedded_model_dir

    repeats = args.repeats or (3 if args.quick else 9)
    names = [DEFAULT_MODEL] if args.quick else list(EMBEDDED_MODELS)
    lengths = [64, 512] if args.quick else [32, 64, 128, 256, 512]
    text = " ".join(common.triviaqa_questions(100 if args.quick else 300))
    config = GenerationConfig.greedy()
    rows, raw_times = [], {}
    for name in names:
        tok = load_tokenizer_json(embedded_model_dir(EMBEDDED_MODELS[name]))
        rules = StopRules(tok, config.stop, {tok.eos_token_id})
        words = tok(" " + text, add_special_tokens=False)["input_ids"]
        stop = tok(" Question:", add_special_tokens=False)["input_ids"]
        for n in lengths:
            # No newline inside: a newline token is itself a stop token and would end the answer.
            body = [i for i in words if "\n" not in tok.decode([i])][: n - len(stop)] + stop
            lp = -np.full(len(body), 0.5)
            before = reference_split(rules, body, lp, None, config)
            after = rules.split(body, lp, None, config)
            assert after == before and after.finish_reason == "stop"
            timed = common.interleave(
                {
                    "before": partial(reference_split, rules, body, lp, None, config),
                    "now": partial(rules.split, body, lp, None, config),
                },
                repeats,
            )
            ratio = common.paired_ratios(timed["before"]["seconds"], timed["now"]["seconds"])
            raw_times[f"{name}/{n}"] = timed
            rows.append(
                {
                    "tokenizer": name,
                    "answer tokens": len(body),
                    "before ms": 1000 * timed["before"]["median_s"],
                    "now ms": 1000 * timed["now"]["median_s"],
                    "before/now (median paired)": ratio["median_paired_ratio"],
                    "load 1-min": timed["now"]["load_1min"][0],
                }
            )
    print(common.table(rows))
    summary = {
        name: max((r for r in rows if r["tokenizer"] == name), key=lambda r: r["answer tokens"])[
            "before/now (median paired)"
        ]
        for name in names
    }
    common.finish(
        "stop_split",
        args,
        {"repeats": repeats, "table": rows, "summary": summary, "raw": raw_times},
        info,
    )


if __name__ == "__main__":
    main()
