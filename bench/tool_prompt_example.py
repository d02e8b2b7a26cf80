"""Does the tool prompt's example call bias the tool-call benchmark? A check of one design choice.

The documented tool prompt (:func:`gnll.toolcalls.tool_system_prompt`) shows one example call,
``{"name": "example_function", "arguments": {"x": 1}}``. A small model may copy it: under the
call grammar the copied name cannot be written, so the forced, offered name would get a large NLL
that measures the copying, not the call. This script answers the same tasks of
``bench/tool_calls.py`` (its tools, tasks and verdicts) with the documented prompt and with a
format-only example (``{"name": <function-name>, "arguments": <args-json-object>}``, the placeholder
form of Hermes/Qwen tool prompts), and prints per prompt:

- right calls, and the mean function-name NLL (raw distribution, the benchmark's ``name_nll``);
- the model's five most likely next tokens (no grammar) where the function name begins, after
  ``<tool_call>\\n{"name": "``: does it want an offered name, the example, or something else?

Usage (one thread; a few minutes for SmolLM2 at ``--limit 4``)::

    OMP_NUM_THREADS=1 python bench/tool_prompt_example.py --model smollm2-135m-instruct --limit 4
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from tool_calls import TOOLS, is_right, tasks  # noqa: E402

from gnll.backends.base import ChatPrompt  # noqa: E402
from gnll.toolcalls import (  # noqa: E402
    CALL_CLOSE,
    CALL_OPEN,
    call_grammar,
    call_report,
    parse_output,
    tool_system_prompt,
)


def format_only_prompt(tools: list[dict[str, Any]]) -> str:
    """The documented prompt with the example call replaced by placeholders."""
    documented = tool_system_prompt(tools)
    example = f'{CALL_OPEN}\n{{"name": "example_function", "arguments": {{"x": 1}}}}\n{CALL_CLOSE}'
    placeholders = (
        f'{CALL_OPEN}\n{{"name": <function-name>, "arguments": <args-json-object>}}\n{CALL_CLOSE}'
    )
    if example not in documented:
        raise SystemExit(
            "the documented tool prompt no longer shows the example this script replaces"
        )
    return documented.replace(example, placeholders)


def top_next_tokens(model: Any, system: str, question: str, k: int = 5) -> list[tuple[str, float]]:
    """The ``k`` most likely tokens where the function name begins, without a grammar."""
    import torch

    tok, net = model.tokenizer, model.model
    text = tok.apply_chat_template(
        [{"role": "system", "content": system}, {"role": "user", "content": question}],
        tokenize=False,
        add_generation_prompt=True,
    )
    ids = tok(text + CALL_OPEN + '\n{"name": "', return_tensors="pt", add_special_tokens=False)
    with torch.no_grad():
        logp = torch.log_softmax(net(ids.input_ids).logits[0, -1].float(), -1)
    top = torch.topk(logp, k)
    return [
        (tok.decode([int(i)]), round(float(v), 2))
        for v, i in zip(top.values, top.indices, strict=True)
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--limit", type=int, default=4, help="tasks of each kind")
    ap.add_argument("--max_tokens", type=int, default=64)
    a = ap.parse_args(argv)
    from gnll import load_model

    model = load_model(a.model, progress=False)
    grammar = call_grammar([t["function"] for t in TOOLS])
    names = [t["function"]["name"] for t in TOOLS]
    prompts = {"documented": tool_system_prompt(TOOLS), "format-only": format_only_prompt(TOOLS)}
    summary = {}
    for label, system in prompts.items():
        right, name_nll, example_top = 0, [], 0
        for task in tasks(a.limit):
            top = top_next_tokens(model, system, task["question"])
            example_top += top[0][0].strip().lower() == "example"
            chat = [
                {"role": "system", "content": system},
                {"role": "user", "content": task["question"]},
            ]
            gen = model.generate_constrained(
                ChatPrompt.of(chat), grammar, max_new_tokens=a.max_tokens
            )
            parsed = parse_output(gen.text, names)
            ok, nll = False, None
            if parsed.calls:
                call = parsed.calls[0]
                [rep] = call_report(gen.tokens, gen.token_logprobs, gen.text, parsed.calls[:1])
                ok, nll = is_right(task, call.name, call.arguments), rep["name_nll"]
                name_nll.append(nll)
            right += ok
            print(
                f"{label:11} {task['kind']:10} right={ok!s:5} name_nll={nll} top={top}", flush=True
            )
        summary[label] = {
            "tasks": 3 * a.limit,
            "right": right,
            "mean_name_nll": round(sum(name_nll) / max(len(name_nll), 1), 3),
            "example_is_the_top_token": example_top,
        }
    print(json.dumps({"model": a.model, "prompts": summary}, indent=2))


if __name__ == "__main__":
    main()
