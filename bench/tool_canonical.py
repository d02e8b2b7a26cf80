"""Canonical tokens under the call grammar: for a few prompts that require a call (the model test's
two tools), SmolLM2's constrained greedy output, whether its tokens are how the tokenizer writes
the text, and the gap between the served NLL (the decode's raw log-probs) and a teacher-forced
score of the output's text (what `gnll score` gives). The gap must be within
BATCH_INVARIANCE_ATOL when the output is canonical.

    OMP_NUM_THREADS=1 nice -n 10 python bench/tool_canonical.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from gnll import load_model
from gnll.backends.base import BATCH_INVARIANCE_ATOL, ChatPrompt
from gnll.toolcalls import call_grammar, tool_system_prompt

# the tool definitions' one home, shared with the tests
sys.path.append(str(Path(__file__).resolve().parent.parent / "tests"))
from tool_sets import WEATHER_AND_CALCULATOR  # noqa: E402

TOOLS = WEATHER_AND_CALCULATOR
QUESTIONS = [
    "What is the weather in Paris?",
    "What is 12 times 7?",
    "How warm is it in Tokyo today?",
    "Add 3 and 4.",
    "Weather in Berlin please",
]


def main() -> None:
    model = load_model("smollm2-135m-instruct", progress=False)
    grammar = call_grammar([t["function"] for t in TOOLS])
    system = tool_system_prompt(TOOLS)
    for q in QUESTIONS:
        prompt = ChatPrompt.of([{"role": "system", "content": system}, {"role": "user", "content": q}])
        t0 = time.perf_counter()
        gen = model.generate_constrained(prompt, grammar, max_new_tokens=64)
        seconds = time.perf_counter() - t0
        ids = model.tokenizer(gen.text, add_special_tokens=False)["input_ids"]
        [ref] = model.score([prompt], [gen.text])
        gap = -sum(ref.token_logprobs) + sum(gen.token_logprobs)
        ok = abs(gap) <= BATCH_INVARIANCE_ATOL
        print(
            f"{q!r}: {seconds:.1f} s, canonical={ids == gen.token_ids} ({len(gen.token_ids)} tokens), "
            f"served NLL {-sum(gen.token_logprobs):.5f}, score(text) {-sum(ref.token_logprobs):.5f}, "
            f"gap {gap:+.5f} ({'within' if ok else 'OUTSIDE'} {BATCH_INVARIANCE_ATOL})"
        )


if __name__ == "__main__":
    main()
