"""Tool calls (issue 46): which NLL says a call is wrong, and how many wrong calls a gate stops.

A tool-task set is generated from gnll's embedded data, each task with its ground truth, and every
task offers the same three tools, so the function name is a choice too:

- ``lookup``: a TriviaQA question; the call must be ``lookup(title)`` with the title one of the
  question's gold aliases (normalised as ``gnll eval`` normalises answers);
- ``calculator``: a SVAMP problem whose equation is one operation; the call must be
  ``calculator(a, op, b)`` whose value is the gold answer;
- ``convert``: "How many <to> are in <v> <from>?" with ``v`` a SVAMP number and a unit pair drawn
  with a fixed seed; the call must be ``convert(value, from_unit, to_unit)`` with exactly those.

Each model answers every task in-process with ``tool_choice: "required"``: the call is decoded
greedily under the call grammar (:func:`gnll.toolcalls.call_grammar`, llguidance), from the
documented tool prompt, as ``gnll serve`` decodes it. Per call (:func:`gnll.toolcalls.call_report`),
all NLLs under the model's raw distribution:

- ``argument NLL``: the sum of the argument values' NLLs (value tokens only);
- ``max argument NLL``: the largest one argument value's NLL;
- ``call G-NLL``: every token of the call's JSON;
- ``output NLL``: the whole output (tags included);
- ``name NLL``: the function name's tokens.

With ``--shots K`` the conversation first holds ``K`` worked examples of each kind (their
questions and right calls, as an agent loop's earlier turns; taken from past the evaluated tasks),
as the paper's protocol gives its QA tasks few-shot prompts.

Reported: accuracy, the AUROC of each score for "the call is right", and a gate calibrated on the
first half of the tasks (the lowest threshold on argument NLL / output NLL that withholds at most
20% of that half's right calls), applied to the second half: wrong calls executed and right calls
withheld, against executing every call.

Usage (niced, one thread; ``--limit`` per task kind)::

    OMP_NUM_THREADS=1 nice -n 10 python bench/tool_calls.py --model smollm2-135m-instruct \\
        --output bench/results/tool_calls_smollm2.jsonl
    python bench/tool_calls.py --report bench/results/tool_calls_smollm2.jsonl
    OMP_NUM_THREADS=1 nice -n 10 python bench/tool_calls.py --model smollm2-135m-instruct \\
        --shots 1 --output bench/results/tool_calls_smollm2_1shot.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import re
import sys
import time
from itertools import zip_longest
from pathlib import Path
from typing import Any

from gnll.backends.base import ChatPrompt
from gnll.evaluation.data.datasets import load_dataset
from gnll.evaluation.results.metrics import auroc
from gnll.text import normalize_answer
from gnll.toolcalls import (
    call_grammar,
    call_report,
    parse_output,
    render_call,
    tool_system_prompt,
)

# the tool definitions' one home, shared with the tests
sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))
from tool_sets import CALCULATOR, LOOKUP, convert_tool  # noqa: E402

PAIRS = [
    ("kilometers", "meters"),
    ("meters", "centimeters"),
    ("hours", "minutes"),
    ("minutes", "seconds"),
    ("kilograms", "grams"),
    ("liters", "milliliters"),
]
UNITS = list(dict.fromkeys(u for pair in PAIRS for u in pair))
TOOLS = [LOOKUP, CALCULATOR, convert_tool(UNITS)]
_OPS = {
    "+": lambda a, b: a + b,
    "-": lambda a, b: a - b,
    "*": lambda a, b: a * b,
    "/": lambda a, b: a / b if b else float("nan"),
}


def tasks(limit: int) -> list[dict[str, Any]]:
    """The task set: ``limit`` of each kind, in a fixed order, the kinds interleaved."""
    trivia, _ = load_dataset("triviaqa", source="embedded")
    svamp, _ = load_dataset("svamp", source="embedded")
    out: list[dict[str, Any]] = []
    for ex in trivia[:limit]:
        out.append(
            {
                "kind": "lookup",
                "id": ex.id,
                "question": ex.question,
                "gold": [normalize_answer(a) for a in ex.answers],
                "call": {"title": ex.answers[0]},
            }
        )
    n = 0
    for ex in svamp:
        eq = ex.extra.get("equation") or ""
        if n >= limit or not re.fullmatch(r"\s*\(\s*[\d.]+\s*[-+*/]\s*[\d.]+\s*\)\s*", eq or ""):
            continue
        a, op, b = re.fullmatch(r"\s*\(\s*([\d.]+)\s*([-+*/])\s*([\d.]+)\s*\)\s*", eq).groups()
        out.append(
            {
                "kind": "calculator",
                "id": ex.id,
                "question": f"{ex.context} {ex.question}".strip(),
                "gold": ex.numeric_answer,
                "call": {"a": _number(a), "op": op, "b": _number(b)},
            }
        )
        n += 1
    rng = random.Random(46)
    numbers = [int(x) for ex in svamp for x in re.findall(r"\b\d+\b", ex.context or "")][
        : 4 * limit
    ]
    for k in range(limit):
        src, dst = rng.choice(PAIRS)
        v = numbers[k % len(numbers)] if numbers else k + 1
        out.append(
            {
                "kind": "convert",
                "id": f"conv-{k}",
                "question": f"How many {dst} are in {v} {src}?",
                "gold": {"value": v, "from_unit": src, "to_unit": dst},
                "call": {"value": v, "from_unit": src, "to_unit": dst},
            }
        )
    # interleaved (lookup, calculator, convert, lookup, ...): a partial run covers every kind
    kinds: dict[str, list[dict[str, Any]]] = {}
    for t in out:
        kinds.setdefault(t["kind"], []).append(t)
    return [t for group in zip_longest(*kinds.values()) for t in group if t is not None]


def _number(text: str) -> int | float:
    value = float(text)
    return int(value) if value.is_integer() else value


def shots(limit: int, k: int) -> list[dict[str, Any]]:
    """``k`` worked examples of each kind, from past the evaluated tasks (``tasks(limit)``)."""
    more = tasks(limit + k)
    if more[: 3 * limit] != tasks(limit):
        raise SystemExit("the task set's first tasks changed with its size: no examples outside it")
    return more[3 * limit :]


def conversation(task: dict[str, Any], system: str, examples: list[dict[str, Any]]) -> ChatPrompt:
    """The tool prompt, each example's question and its right call (an earlier turn of an agent
    loop, written as :func:`gnll.toolcalls.tool_conversation` writes one), then the task."""
    messages = [{"role": "system", "content": system}]
    for ex in examples:
        messages.append({"role": "user", "content": ex["question"]})
        messages.append({"role": "assistant", "content": render_call(ex["kind"], ex["call"])})
    messages.append({"role": "user", "content": task["question"]})
    return ChatPrompt.of(messages)


def is_right(task: dict[str, Any], name: str, args: dict[str, Any]) -> bool:
    if name != task["kind"]:
        return False
    if name == "lookup":
        return normalize_answer(str(args.get("title", ""))) in task["gold"]
    if name == "calculator":
        try:
            value = _OPS[args["op"]](float(args["a"]), float(args["b"]))
        except (KeyError, TypeError, ValueError):
            return False
        return abs(value - float(task["gold"])) < 1e-6  # same path: arithmetic, not log-probs
    gold = task["gold"]
    try:
        return (
            float(args["value"]) == float(gold["value"])
            and args["from_unit"] == gold["from_unit"]
            and args["to_unit"] == gold["to_unit"]
        )
    except (KeyError, TypeError, ValueError):
        return False


def run(model_name: str, output: Path, limit: int, max_tokens: int, k: int = 0) -> None:
    from gnll import load_model

    model = load_model(model_name, progress=False)
    grammar = call_grammar([t["function"] for t in TOOLS])
    system = tool_system_prompt(TOOLS)
    done = set()
    if output.exists():
        done = {json.loads(line)["id"] for line in output.read_text().splitlines() if line.strip()}
    names = [t["function"]["name"] for t in TOOLS]
    examples = shots(limit, k) if k else []
    with output.open("a") as fh:
        for task in tasks(limit):
            if task["id"] in done:
                continue
            prompt = conversation(task, system, examples)
            started = time.perf_counter()
            gen = model.generate_constrained(prompt, grammar, max_new_tokens=max_tokens)
            parsed = parse_output(gen.text, names)
            row: dict[str, Any] = {
                "id": task["id"],
                "kind": task["kind"],
                "model": model_name,
                "shots": k,
                "text": gen.text,
                "finish": gen.finish_reason,
                "seconds": round(time.perf_counter() - started, 2),
                "output_nll": -sum(gen.token_logprobs),
            }
            if parsed.calls:
                call = parsed.calls[0]
                [rep] = call_report(
                    gen.tokens,
                    gen.token_logprobs,
                    gen.text,
                    parsed.calls[:1],
                    constrained_logprobs=gen.constrained_logprobs,
                )
                row.update(
                    name=call.name,
                    arguments=call.arguments,
                    right=is_right(task, call.name, call.arguments),
                    call_g_nll=rep["g_nll"],
                    name_nll=rep["name_nll"],
                    argument_nll=sum(a["nll"] for a in rep["arguments"]),
                    max_argument_nll=rep["max_argument_nll"] or 0.0,
                    constrained_call_g_nll=rep["constrained_g_nll"],
                )
            else:  # cut at max_tokens: no call, counted as wrong
                row.update(name=None, right=False, error=parsed.error)
            fh.write(json.dumps(row) + "\n")
            fh.flush()


SCORES = ("argument_nll", "max_argument_nll", "call_g_nll", "output_nll", "name_nll")


def _gate(rows: list[dict[str, Any]], score: str, max_withheld: float = 0.2) -> dict[str, Any]:
    half = len(rows) // 2
    fit, test = rows[:half], rows[half:]
    right = sorted(r[score] for r in fit if r["right"])
    if not right:
        return {"threshold": None}
    # the lowest threshold that withholds at most max_withheld of the fit half's right calls
    k = min(len(right) - 1, int((1 - max_withheld) * len(right)))
    t = right[k]
    executed_wrong = sum(1 for r in test if not r["right"] and r[score] <= t)
    wrong = sum(1 for r in test if not r["right"])
    withheld_right = sum(1 for r in test if r["right"] and r[score] > t)
    right_n = sum(1 for r in test if r["right"])
    return {
        "threshold": t,
        "test_tasks": len(test),
        "wrong_calls_without_gate": wrong,
        "wrong_calls_executed": executed_wrong,
        "fewer_wrong_executed": 1 - executed_wrong / wrong if wrong else None,
        "right_calls": right_n,
        "right_calls_withheld": withheld_right,
        "right_withheld_share": withheld_right / right_n if right_n else None,
    }


def report(path: Path) -> dict[str, Any]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    # interleave the kinds so both halves of the gate hold each kind
    by_kind: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        by_kind.setdefault(r["kind"], []).append(r)
    mixed = [r for group in zip_longest(*by_kind.values()) for r in group if r is not None]
    called = [r for r in mixed if r.get("name") is not None]
    out: dict[str, Any] = {
        "benchmark": "tool_calls",  # every results file names its benchmark (bench/report.py)
        "tasks": len(rows),
        "calls": len(called),
        "accuracy": sum(r["right"] for r in rows) / len(rows) if rows else None,
        "accuracy_by_kind": {k: sum(r["right"] for r in v) / len(v) for k, v in by_kind.items()},
        "mean_seconds": sum(r["seconds"] for r in rows) / len(rows) if rows else None,
    }
    labels = [bool(r["right"]) for r in called]
    if 0 < sum(labels) < len(labels):
        out["auroc"] = {s: auroc(labels, [r[s] for r in called]) for s in SCORES}
    out["gate"] = {s: _gate(called, s) for s in ("argument_nll", "max_argument_nll", "output_nll")}
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--output", type=Path)
    ap.add_argument("--limit", type=int, default=110, help="tasks of each kind")
    ap.add_argument("--max_tokens", type=int, default=64)
    ap.add_argument(
        "--shots", type=int, default=0, help="worked examples of each kind before the task"
    )
    ap.add_argument("--report", type=Path, help="only summarise a finished run")
    a = ap.parse_args(argv)
    if a.report:
        json.dump(report(a.report), sys.stdout, indent=2)
        print()
        return
    if a.output is None:
        ap.error("--output is required to run")
    a.output.parent.mkdir(parents=True, exist_ok=True)
    run(a.model, a.output, a.limit, a.max_tokens, a.shots)
    json.dump(report(a.output), sys.stdout, indent=2)
    print()


if __name__ == "__main__":
    main()
