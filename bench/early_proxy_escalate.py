"""Proxy-mode escalation with exact early decisions: the client's time to the first escalated token.

Two llama.cpp servers (llama-cpp-python, ``--interrupt_requests false``): SmolLM2-135M-Instruct
(small) and Gemma-3-270M (large), their GGUF files as their PyPI packages ship them. Two ``gnll
serve --upstream SMALL --policy escalate --threshold T --escalate-to LARGE`` processes stand in
front of them: one with ``--early`` (it closes SmolLM2's stream at the exact decision token and
sends the request to Gemma at that moment), one with ``--no-early`` (it waits for SmolLM2's whole
answer). Each ``triviaqa_long`` question (one sentence, up to 100 tokens, the prompt ``gnll eval``
renders, in SmolLM2's chat template, sent as a ``/v1/completions`` text prompt that stops at a newline:
the base model Gemma otherwise runs on to ``max_tokens``) goes through both, one request at a
time, the arms' order rotated per question, with the openai SDK streaming (a greedy request under
escalate is held until SmolLM2's answer is decided; an escalated one is then streamed live from
Gemma, so its first chunk comes with Gemma's first token, in both arms).

An answer that is empty (the stop token at once) has no G-NLL from llama-cpp-python, which reports
no log-prob for the stop token: the proxy answers 502, in both arms alike, and such questions are
counted as ``unscored``.

Reported: decisions that differ between the arms (must be 0), and over the questions escalated:
the client's mean and median time to the first chunk of the escalated answer, early vs wait, their
ratio, and the answer tokens SmolLM2 generated (early: up to the decision; wait: the whole answer).

``--local inprocess`` runs the in-process cascade instead: SmolLM2 answers inside the two ``gnll
serve --model smollm2-135m-instruct`` processes (no SmolLM2 server), each question asked exactly as
``gnll eval`` renders it for SmolLM2 (its system turn included), so ``--threshold 23.6023``, the
threshold of ``bench/calibrations/smollm2-triviaqa_long.json``, is the calibrated escalation
threshold of the answers it was fitted on; its result is ``early_inprocess_escalate``.

Usage::

    nice -n 10 python bench/early_proxy_escalate.py --n 40 --data_dir ../shared/data \\
        --output bench/results/early_proxy_escalate.json
    nice -n 10 python bench/early_proxy_escalate.py --local inprocess --n 200 --start 400 \\
        --threshold 23.6023 --data_dir ../shared/data \\
        --output bench/results/early_inprocess_escalate.json
    python bench/early_proxy_escalate.py --quick
"""

from __future__ import annotations

import contextlib
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import common
import httpx

CHATML = "<|im_start|>user\n{}<|im_end|>\n<|im_start|>assistant\n"
#: SmolLM2's template with its default system turn: the prompt exactly as ``gnll eval`` renders it
#: for SmolLM2, the prompts ``bench/calibrations/smollm2-triviaqa_long.json`` was fitted on
#: (``--local inprocess --threshold 23.6023``: that file's threshold).
EVAL_CHATML = (
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n" + CHATML
)


def serve(args: list[str], port: int, log: Path) -> subprocess.Popen:
    """A ``gnll serve`` process on ``port``, once its ``/health`` says it is ready."""
    cmd = [*common.gnll_cli(), "serve", "--port", str(port), *args]
    out = open(log, "w")  # noqa: SIM115 - the process writes it until it is stopped
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"gnll serve exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    proc.kill()
    raise RuntimeError(f"gnll serve did not come up: {log.read_text()[-2000:]}")


def ask(url: str, model: str, prompt: str, max_tokens: int) -> dict[str, Any]:
    """One streamed greedy request through the openai SDK: time to the first answer chunk, total
    time, the text and the last chunk's ``uncertainty``."""
    import openai

    client = openai.OpenAI(base_url=url, api_key="x", max_retries=0, timeout=300)
    started = time.perf_counter()
    first, pieces, u = None, [], None
    for chunk in client.completions.create(
        model=model, prompt=prompt, max_tokens=max_tokens, stop=["\n"], stream=True
    ):
        if not chunk.choices:
            continue
        if first is None:
            first = time.perf_counter() - started
        choice = chunk.choices[0]
        pieces.append(choice.text or "")
        u = (choice.model_extra or {}).get("uncertainty") or u
    assert u is not None, "no uncertainty in the stream"
    local = u.get("local") or u
    return {
        "first_chunk_s": first,
        "total_s": time.perf_counter() - started,
        "text": "".join(pieces),
        "escalated": bool(u.get("escalated")),
        "answered_by": u.get("answered_by"),
        "early": bool(local.get("early")),
        "decided_at_token": local.get("decided_at_token"),
        # answer tokens SmolLM2 generated: up to the decision, or its whole answer
        "small_tokens": local.get("tokens_generated") or local.get("num_tokens"),
        "small_g_nll": local.get("g_nll"),
        "escalation_error": u.get("escalation_error"),
    }


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--n", type=int, default=None, help="questions (default 40; quick 4)")
    ap.add_argument("--threshold", type=float, default=12.0, help="escalate above this G-NLL")
    ap.add_argument("--task", default="triviaqa_long")
    ap.add_argument("--start", type=int, default=400, help="first question of the eval split")
    ap.add_argument("--data_dir", type=Path, default=None)
    ap.add_argument(
        "--local",
        choices=("proxy", "inprocess"),
        default="proxy",
        help="who answers first: SmolLM2's llama.cpp server behind the proxy (proxy), or SmolLM2 "
        "in the gnll serve process itself (inprocess: the in-process cascade)",
    )
    args = ap.parse_args()
    info = common.machine()
    import openai

    from gnll.backends.embedded import EMBEDDED_MODELS
    from gnll.backends.openai.launch import LlamaServer, free_port
    from gnll.evaluation.data.tasks import get_task

    n = args.n or (4 if args.quick else 40)
    td = get_task(args.task).load(data_dir=args.data_dir)
    examples = td.split("eval", args.start + n)[args.start :]
    if len(examples) < n:
        ap.error(
            f"{len(examples)} questions of {args.task} from --start {args.start}, not {n}: "
            "pass --data_dir (the full files) or a smaller --start"
        )
    # SmolLM2 is an instruct model: asked the bare text it often stops at once (an empty answer,
    # with no G-NLL from llama-cpp-python), so the prompt is rendered in its chat template
    # (ChatML), as ``gnll eval`` asks it; Gemma-3-270M, a base model, continues the same text.
    template = EVAL_CHATML if args.local == "inprocess" else CHATML
    prompts = [template.format(td.prompt(ex)) for ex in examples]
    max_tokens = td.task.max_new_tokens
    scratch = Path(tempfile.mkdtemp(prefix="gnll-bench-"))
    small_gguf = (
        None
        if args.local == "inprocess"
        else EMBEDDED_MODELS["smollm2-135m-instruct"].gguf(scratch)
    )
    large_gguf = EMBEDDED_MODELS["gemma-3-270m"].gguf(scratch)
    rows: list[dict[str, Any]] = []
    inprocess = args.local == "inprocess"
    with (
        # a short context: llama-cpp-python turns its whole (n_ctx x vocabulary) logit buffer
        # into log-probs on every request, and Gemma's vocabulary has 262k entries
        contextlib.nullcontext()
        if inprocess
        else LlamaServer(small_gguf, "smollm2", n_ctx=320, lifetime=7200) as small,
        LlamaServer(large_gguf, "gemma", n_ctx=320, lifetime=7200) as large,
    ):
        small_name = "smollm2-135m-instruct" if inprocess else "smollm2"
        local = ["--model", small_name] if inprocess else ["--upstream", small.base_url]
        common_args = [
            *local, "--policy", "escalate",
            "--threshold", str(args.threshold), "--escalate-to", large.base_url,
            "--upstream-timeout", "600",
        ]  # fmt: skip
        procs = {}
        urls = {}
        try:
            for arm, flag in (("early", "--early"), ("wait", "--no-early")):
                port = free_port()
                procs[arm] = serve([*common_args, flag], port, scratch / f"serve-{arm}.log")
                urls[arm] = f"http://127.0.0.1:{port}/v1"
            for q, prompt in enumerate(prompts):
                order = ("early", "wait") if q % 2 == 0 else ("wait", "early")
                row: dict[str, Any] = {"question": args.start + q, "order": list(order)}
                for arm in order:
                    try:
                        row[arm] = ask(urls[arm], small_name, prompt, max_tokens)
                    except openai.APIStatusError as exc:
                        # SmolLM2 answers some text prompts with its stop token at once:
                        # llama-cpp-python reports no log-prob for it, so there is no G-NLL
                        row[arm] = {"error": str(exc.message)[:300]}
                rows.append(row)
                e, w = row["early"], row["wait"]
                if "error" in e or "error" in w:
                    print(f"q{q}: unscored: {e.get('error') or w.get('error')}", flush=True)
                    continue
                print(
                    f"q{q}: escalated {e['escalated']}/{w['escalated']} "
                    f"first chunk {e['first_chunk_s']:.2f}/{w['first_chunk_s']:.2f} s "
                    f"small tokens {e['small_tokens']}/{w['small_tokens']}",
                    flush=True,
                )
        finally:
            for proc in procs.values():
                proc.terminate()
                proc.wait(30)
    summary = summarise(rows)
    print(common.table([summary]))
    results = {
        "task": args.task,
        "threshold": args.threshold,
        "local": args.local,
        "small": "smollm2-135m-instruct (gnll serve --model, transformers, float32)"
        if args.local == "inprocess"
        else "smollm2-135m-instruct (llama-cpp-python, GGUF Q4_1)",
        "large": "gemma-3-270m (llama-cpp-python, GGUF Q4_K_M)",
        "summary": summary,
        "per_question": rows,
    }
    name = "early_inprocess_escalate" if args.local == "inprocess" else "early_proxy_escalate"
    common.finish(name, args, results, info)


def summarise(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Decision changes, and the escalated questions' time to first chunk and small tokens."""
    unscored = [r for r in rows if "error" in r["early"] or "error" in r["wait"]]
    rows = [r for r in rows if r not in unscored]
    changes = sum(r["early"]["escalated"] != r["wait"]["escalated"] for r in rows)
    esc = [r for r in rows if r["early"]["escalated"] and r["wait"]["escalated"]]
    out: dict[str, Any] = {
        "questions": len(rows) + len(unscored),
        # both arms failed alike: the small answer was empty and had no G-NLL
        "unscored": len(unscored),
        "unscored_in_one_arm_only": sum(
            ("error" in r["early"]) != ("error" in r["wait"]) for r in unscored
        ),
        "escalated": len(esc),
        "decision_changes": changes,
        "decided_early": sum(r["early"]["early"] for r in esc),
        "same_escalated_text": sum(r["early"]["text"] == r["wait"]["text"] for r in esc),
        "escalated_with_answer": sum(r["early"]["answered_by"] == "gemma" for r in esc),
        "escalation_errors": sum(
            bool(r[a]["escalation_error"]) for r in rows for a in ("early", "wait")
        ),
        "small_tokens_early": sum(r["early"]["small_tokens"] or 0 for r in rows),
        "small_tokens_wait": sum(r["wait"]["small_tokens"] or 0 for r in rows),
    }
    if esc:
        e = [r["early"]["first_chunk_s"] for r in esc]
        w = [r["wait"]["first_chunk_s"] for r in esc]
        out.update(
            mean_first_escalated_s_early=statistics.fmean(e),
            mean_first_escalated_s_wait=statistics.fmean(w),
            median_first_escalated_s_early=statistics.median(e),
            median_first_escalated_s_wait=statistics.median(w),
            ratio_of_means=statistics.fmean(e) / statistics.fmean(w),
            median_paired_ratio=statistics.median(a / b for a, b in zip(e, w, strict=True)),
            small_tokens_escalated_early=sum(r["early"]["small_tokens"] or 0 for r in esc),
            small_tokens_escalated_wait=sum(r["wait"]["small_tokens"] or 0 for r in esc),
        )
    return out


if __name__ == "__main__":
    main()
