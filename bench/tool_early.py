"""Exact early decisions on tool calls, side by side: each task of bench/tool_calls.py decoded under
the call grammar to its end, and again stopping at the gate's decision (gnll.toolwatch), with the
gate at the median call G-NLL and the median largest-argument NLL of the SmolLM2 tool-call run
(bench/results/tool_calls_smollm2_partial.jsonl). Per task: the tokens generated and the seconds of
each run, and whether the decisions agree (they must: the watch reading the full output decides
exactly when the early run stopped).

    OMP_NUM_THREADS=1 nice -n 10 python bench/tool_early.py --limit 3 \\
        --output bench/results/tool_early_smollm2.jsonl
    python bench/tool_early.py --report bench/results/tool_early_smollm2.jsonl
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from tool_calls import TOOLS, tasks  # noqa: E402

from gnll.backends.base import ChatPrompt  # noqa: E402
from gnll.toolcalls import call_grammar, tool_system_prompt  # noqa: E402
from gnll.toolwatch import CallWatch, ToolCallDecision  # noqa: E402

#: The gate: medians of the SmolLM2 run (85 calls): call G-NLL 49.96, largest argument NLL 5.67.
CALL_THRESHOLD = 49.96
ARGUMENT_THRESHOLD = 5.67


def run(model_name: str, output: Path, limit: int, max_tokens: int) -> None:
    from gnll import load_model

    model = load_model(model_name, progress=False)
    grammar = call_grammar([t["function"] for t in TOOLS])
    system = tool_system_prompt(TOOLS)

    def abstains(g: float) -> bool:
        return g > CALL_THRESHOLD

    with output.open("w") as fh:
        for task in tasks(limit):
            prompt = ChatPrompt.of(
                [
                    {"role": "system", "content": system},
                    {"role": "user", "content": task["question"]},
                ]
            )
            t0 = time.perf_counter()
            full = model.generate_constrained(prompt, grammar, max_new_tokens=max_tokens)
            t1 = time.perf_counter()
            rule = ToolCallDecision(abstains, argument_threshold=ARGUMENT_THRESHOLD)
            early = model.generate_constrained(
                prompt, grammar, max_new_tokens=max_tokens, watch=rule.push_token
            )
            t2 = time.perf_counter()
            # the end-of-output decision: the same watch over the full output's tokens
            watch = CallWatch(abstains, argument_threshold=ARGUMENT_THRESHOLD)
            for tok, lp in zip(full.tokens, full.token_logprobs, strict=True):
                if watch.push(tok, lp):
                    break
            row: dict[str, Any] = {
                "id": task["id"],
                "kind": task["kind"],
                "full_tokens": len(full.token_ids) + len(full.terminator_token_ids),
                "early_tokens": len(early.token_ids) + len(early.terminator_token_ids),
                "full_seconds": round(t1 - t0, 2),
                "early_seconds": round(t2 - t1, 2),
                "withheld_full": watch.decided,
                "withheld_early": early.finish_reason == "decided",
                "decided_at": rule.decision.at_token,
                "full_decided_at": watch.decided_at,
                "same_prefix": early.token_ids == full.token_ids[: len(early.token_ids)],
            }
            fh.write(json.dumps(row) + "\n")
            fh.flush()
            print(json.dumps(row), flush=True)


def report(path: Path) -> dict[str, Any]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    held = [r for r in rows if r["withheld_early"]]
    out = {
        "tasks": len(rows),
        "withheld": len(held),
        "decisions_agree": sum(r["withheld_full"] == r["withheld_early"] for r in rows),
        "decided_at_agree": sum(r["decided_at"] == r["full_decided_at"] for r in held),
        "same_prefix": sum(r["same_prefix"] for r in rows),
        "tokens_full_withheld": sum(r["full_tokens"] for r in held),
        "tokens_early_withheld": sum(r["early_tokens"] for r in held),
        "seconds_full_withheld": round(sum(r["full_seconds"] for r in held), 1),
        "seconds_early_withheld": round(sum(r["early_seconds"] for r in held), 1),
    }
    if held:
        out["median_fraction_of_tokens_generated"] = round(
            statistics.median(r["early_tokens"] / r["full_tokens"] for r in held), 3
        )
    print(json.dumps(out, indent=1))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--output", type=Path, default=Path("bench/results/tool_early_smollm2.jsonl"))
    ap.add_argument("--limit", type=int, default=4, help="tasks of each kind (3 kinds)")
    ap.add_argument("--max_tokens", type=int, default=64)
    ap.add_argument("--report", type=Path)
    args = ap.parse_args(argv)
    if args.report:
        report(args.report)
        return
    run(args.model, args.output, args.limit, args.max_tokens)
    report(args.output)


if __name__ == "__main__":
    main()
