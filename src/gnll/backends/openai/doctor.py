"""Probe a server and say whether G-NLL computed from it would be right (``gnll doctor``).

Each check returns a :class:`Check` with a verdict and, when something is wrong, the fix. ``fail``
means G-NLL from this server would be wrong (or unavailable); ``warn`` means a limitation that does
not affect the default G-NLL.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Literal

from gnll.backends.base import GenerationConfig
from gnll.backends.openai.client import ServerError, ServerUnavailable
from gnll.backends.openai.model import OpenAICompatModel
from gnll.backends.openai.parse import RawTokens, read_choice, to_generation

Verdict = Literal["pass", "warn", "fail", "info"]

#: Short QA prompts in the paper's format; greedy answers are a few tokens long.
PROBES = (
    "Answer the question concisely.\nQuestion: What is the capital of France?\nAnswer:",
    "Answer the question concisely.\nQuestion: How many legs does a spider have?\nAnswer:",
    "Answer the question concisely.\nQuestion: Who wrote Romeo and Juliet?\nAnswer:",
)
#: An open-ended prompt: its next-token distributions are flat, so any sampling shows within a few
#: tokens (a factual answer can come out greedy by luck even when the server samples).
STORY = "Write a short story about a dragon who learns to cook."
#: Within one response, the chosen token's log-prob and its top-1 alternative's come from the same
#: distribution: they agree exactly when decoding was greedy.
TOLERANCE = 1e-3
#: Across requests the same context's log-probs move with the server's batching and prompt cache:
#: llama.cpp computes a reused prefix's last token alone (quantised activations) and a fresh one in a
#: batch, measured up to ~0.05 apart. Tempering at T=2 moves them by several tenths.
RAW_TOLERANCE = 0.15
#: The temperature of the raw check's sampled requests.
HOT = 2.0
ECHO_TOLERANCE = 0.15

_PIN_FIX = (
    "something between gnll and the model ignores the request's sampling fields: point --base_url "
    "at the server itself rather than a gateway that drops them, or start the server with neutral "
    "defaults (vLLM: --generation-config vllm; llama.cpp: no sampling overrides)"
)


@dataclass
class Check:
    """One line of the doctor's verdict table."""

    name: str
    verdict: Verdict
    detail: str
    fix: str = ""


def diagnose(model: OpenAICompatModel, *, requests: int = 16, concurrency: int = 4) -> list[Check]:
    """Run every check against ``model``'s server; stops early when the server is unusable."""
    checks: list[Check] = []
    try:
        served = model.client.get("/models")
    except (ServerUnavailable, ServerError) as exc:
        url = model.client.base_url.rstrip("/")
        fix = (
            f"the OpenAI API is under /v1 on most servers: try --base_url {url}/v1"
            if "404" in str(exc) and not url.endswith("/v1")
            else "start the server or fix --base_url"
        )
        return [Check("reachable", "fail", str(exc), fix)]
    ids = [str(m.get("id")) for m in served.get("data") or [] if isinstance(m, dict)]
    if ids and model.name not in ids:
        return [
            Check(
                "model served",
                "fail",
                f"the server serves {', '.join(ids)}, not {model.name!r}",
                f"pass --model {ids[0]}",
            )
        ]
    p = model.profile
    checks.append(
        Check(
            "reachable",
            "pass",
            f"{p.name} server serving {model.name!r}; gnll uses /v1/{model.endpoint}"
            + (" with the chat template" if model.chat else " with plain prompts"),
        )
    )
    greedy = GenerationConfig.greedy(max_new_tokens=16)
    plain_chat = False if p.completions else None
    plain_endpoint = "completions" if p.completions else "chat"

    def ask(config: GenerationConfig = greedy, **kw) -> list[RawTokens]:
        return [
            model.request_raw(q, config, chat=plain_chat, endpoint=plain_endpoint, **kw)[0]
            for q in PROBES
        ]

    try:
        raws = ask(top_logprobs=5)
        gens = [
            to_generation(r, greedy, eos_logprob=p.eos_logprob, where=f"probe {i}")
            for i, r in enumerate(raws)
        ]
    except (ServerError, ServerUnavailable) as exc:
        fix = {
            "llama-cpp-python": "start it with --logits_all true",
            "openai": "use a model that supports logprobs (reasoning models do not)",
        }.get(p.name, f"this server must return `logprobs` on /v1/{plain_endpoint}")
        checks.append(Check("log-probs returned", "fail", str(exc), fix))
        return checks
    checks.append(Check("log-probs returned", "pass", "; ".join(f"{g.text!r}" for g in gens)[:120]))
    try:
        story = model.request_raw(
            STORY, GenerationConfig.greedy(max_new_tokens=32, stop=()), top_logprobs=5
        )
    except (ServerError, ServerUnavailable):
        story = []
    checks.append(_greedy_check(raws + story))
    checks.append(_defaults_check(model, raws, ask))
    checks.append(_raw_check(model, raws, ask))
    checks.append(_echo_check(model, gens))
    checks.append(_terminator_check(model, gens))
    checks.append(_chat_check(model))
    checks.append(_determinism_check(model))
    checks.append(_streams_check(model, max(concurrency, 2)))
    checks.append(_speed_check(model, requests, concurrency))
    return checks


def _greedy_check(raws: list[RawTokens]) -> Check:
    for j, raw in enumerate(raws):
        for t, (tok, lp, top) in enumerate(zip(raw.tokens, raw.logprobs, raw.top1, strict=True)):
            if top is not None and lp is not None and lp < top[1] - TOLERANCE:
                return Check(
                    "greedy decoding",
                    "fail",
                    f"probe {j} token {t}: the server chose {tok!r} (log-prob {lp:.3f}) although "
                    f"{top[0]!r} had {top[1]:.3f}; the answer is not the greedy one, so its NLL "
                    "is not G-NLL",
                    _PIN_FIX,
                )
    if not any(raw.top1 and raw.top1[0] is not None for raw in raws):
        return Check(
            "greedy decoding",
            "warn",
            "the server reports no alternatives (top_logprobs)",
            "use a server that returns top_logprobs to have greedy decoding checked",
        )
    return Check("greedy decoding", "pass", "every chosen token is the top-1 token")


def _defaults_check(model: OpenAICompatModel, raws: list[RawTokens], ask: Callable) -> Check:
    pins = {k: None for k in model.profile.pins}
    try:
        loose = ask(overrides=pins)
    except (ServerError, ServerUnavailable) as exc:
        return Check(
            "server defaults",
            "warn",
            f"could not send an unpinned request: {exc}",
            "rerun gnll doctor; gnll pins greedy decoding on every request anyway",
        )
    differ = [j for j, (a, b) in enumerate(zip(raws, loose, strict=True)) if a.tokens != b.tokens]
    if differ:
        return Check(
            "server defaults",
            "pass",
            f"the server's own defaults change the greedy answer (probe {differ[0]}); gnll pins "
            + ", ".join(f"{k}={v}" for k, v in model.profile.pins.items())
            + " on every request",
        )
    return Check("server defaults", "pass", "the server's defaults leave greedy answers unchanged")


def _raw_check(model: OpenAICompatModel, raws: list[RawTokens], ask: Callable) -> Check:
    """Raw log-probs do not depend on the request's temperature; tempered ones move a lot.

    Compared: every alternative both responses report at positions whose context is the same (up to
    the first token where the sampled answer leaves the greedy one). Tempered log-probs have a
    signature of their own: at temperature T the gaps between the alternatives of one position are
    the raw gaps divided by T (``log_softmax(z / T)``), which names the cause.
    """
    hot = GenerationConfig.sample(1, temperature=HOT, max_new_tokens=16, seed=0)
    try:
        sampled = ask(config=hot, top_logprobs=5, seed=7)
    except (ServerError, ServerUnavailable) as exc:
        return Check("log-probs raw", "warn", f"could not sample: {exc}", "rerun gnll doctor")
    worst, compared, ratios = 0.0, 0, []
    for g, s in zip(raws, sampled, strict=True):
        for t in range(min(len(g.tokens), len(s.tokens))):
            both = [tok for tok in s.tops[t] if tok in g.tops[t]]
            for tok in both:
                worst, compared = max(worst, abs(g.tops[t][tok] - s.tops[t][tok])), compared + 1
            ratios.extend(_gap_ratios(g.tops[t], s.tops[t], both))
            if s.tokens[t] != g.tokens[t]:
                break  # contexts differ from here on
    if not compared:
        return Check(
            "log-probs raw",
            "warn",
            "the server reports no alternatives to compare",
            "use a server that returns top_logprobs to have raw log-probs checked",
        )
    if worst > RAW_TOLERANCE:
        return _processed(model, worst, ratios)
    return Check(
        "log-probs raw",
        "pass",
        f"temperature-independent: {compared} log-probs at temperature 0 and {HOT:g} within "
        f"{worst:.1e}",
    )


def _gap_ratios(cold: dict, hot: dict, both: list) -> list[float]:
    """At one position: (gap between two alternatives at T=HOT) / (their gap at T=0), for the
    alternatives far enough apart that the ratio is not noise."""
    if len(both) < 2:
        return []
    ref = max(both, key=lambda tok: cold[tok])
    return [
        (hot[ref] - hot[tok]) / (cold[ref] - cold[tok])
        for tok in both
        if cold[ref] - cold[tok] > 0.5
    ]


def _processed(model: OpenAICompatModel, worst: float, ratios: list[float]) -> Check:
    tempered = bool(ratios) and abs(statistics.median(ratios) - 1 / HOT) < 0.05
    how = (
        f"at temperature {HOT:g} the gaps between alternatives shrink to "
        f"{statistics.median(ratios):.2f} of the greedy ones (1/{HOT:g}): the log-probs are "
        "tempered by the request's temperature"
        if tempered
        else "the server reports processed (tempered/truncated) log-probs"
    )
    detail = (
        f"the same token in the same context has log-probs {worst:.3g} apart at temperature 0 and "
        f"{HOT:g}; {how}"
    )
    if model.profile.name == "vllm":
        return Check(
            "log-probs raw",
            "fail",
            f"{detail}: this vLLM server runs with --logprobs-mode processed_logprobs (log-probs "
            "after temperature, penalties and top-k/top-p), so sampled answers' log-probs are not "
            "the model's",
            "restart vLLM without --logprobs-mode processed_logprobs: its default, --logprobs-mode "
            "raw_logprobs, reports the model's own log-probs",
        )
    return Check(
        "log-probs raw",
        "fail",
        detail,
        "vLLM: --logprobs-mode raw_logprobs (the default); llama.cpp: do not use "
        "post_sampling_probs",
    )


def _echo_check(model: OpenAICompatModel, gens: list) -> Check:
    p = model.profile
    if not p.echo:
        return Check(
            "teacher-forced match",
            "info",
            f"a {p.name} server cannot echo prompt log-probs",
            "none needed for G-NLL; gnll score needs a server that echoes (vLLM)",
        )
    worst, compared, shifted = 0.0, 0, False
    for q, g in zip(PROBES, gens, strict=True):
        k = len(g.tokens)
        if not k:
            continue
        if p.chat_via_tokenize:
            prompt: list[int] | str = model._tokenize(prompt=q) + g.token_ids
        else:
            prompt = q + "".join(g.tokens)
        body = {
            "model": model.name, "prompt": prompt, "echo": True, "max_tokens": 1, "logprobs": 5,
            **model.sampling_parameters(GenerationConfig.greedy()), **p.extras,
        }  # fmt: skip
        try:
            raw = read_choice((model.client.post("/completions", body).get("choices") or [{}])[0])
        except (ServerError, ServerUnavailable) as exc:
            return Check(
                "teacher-forced match", "warn", f"echo request failed: {exc}", "rerun gnll doctor"
            )
        # One generated token follows the echoed prompt, unless generation ended right away.
        for start in (len(raw.tokens) - k - 1, len(raw.tokens) - k):
            if start < 1 or raw.tokens[start : start + k] != g.tokens:
                continue
            forced = [raw.logprobs[start + j] for j in range(k)]
            # llama-cpp-python reads each echoed token's log-prob from the *next* position's
            # distribution when the prompt has no BOS token; the previous position's alternatives
            # then hold the right value.
            before = [raw.tops[start + j - 1].get(tok) for j, tok in enumerate(g.tokens)]
            d_same = _max_diff(forced, g.token_logprobs)
            d_prev = _max_diff(before, g.token_logprobs)
            if d_prev < d_same:
                shifted = True
            worst, compared = max(worst, min(d_same, d_prev)), compared + k
            break
    if not compared:
        return Check(
            "teacher-forced match",
            "warn",
            "the echoed tokens did not line up with the answers",
            "check that the server echoes the prompt's own tokens (vLLM: echo with logprobs)",
        )
    note = (
        " (echo reports each log-prob one position late; read from the alternatives)"
        if shifted
        else ""
    )
    if worst > ECHO_TOLERANCE:
        return Check(
            "teacher-forced match",
            "fail",
            f"generated and teacher-forced log-probs of the same tokens differ by up to {worst:.3g}{note}",
            "the server reports something other than the model's log-probs for generated tokens",
        )
    return Check(
        "teacher-forced match",
        "pass",
        f"generated = teacher-forced log-probs at {compared} tokens (max diff {worst:.1e}){note}",
    )


def _max_diff(a: list, b: list[float]) -> float:
    if any(x is None for x in a):
        return float("inf")
    return max((abs(x - y) for x, y in zip(a, b, strict=True)), default=0.0)


def _terminator_check(model: OpenAICompatModel, gens: list) -> Check:
    if model.capabilities.terminator and any(g.terminator_logprobs for g in gens):
        return Check("terminator reported", "pass", "include_terminator=True is available")
    return Check(
        "terminator reported",
        "warn",
        f"a {model.profile.name} server does not report the end-of-sequence token's log-prob: "
        "include_terminator=True is unavailable (the default G-NLL excludes it, as the paper does)",
        "none needed for the default G-NLL; for include_terminator=True use vLLM",
    )


def _chat_check(model: OpenAICompatModel) -> Check:
    if not model.chat:
        return Check(
            "chat template",
            "info",
            "plain prompts: the model name does not look instruction-tuned",
            "pass --chat (gnll doctor) or chat=true in --model_args if the model is instruction-tuned",
        )
    try:
        rendered = model.render_prompt(PROBES[0])
        [raw] = model.request_raw(PROBES[0], GenerationConfig.greedy(max_new_tokens=8))
    except (ServerError, ServerUnavailable) as exc:
        return Check(
            "chat template",
            "fail",
            f"the chat path failed: {exc}",
            "serve the model with its chat template (vLLM: --chat-template; llama.cpp: a GGUF with "
            "tokenizer.chat_template or --chat_format), or pass chat=false for a base model",
        )
    where = "the server's /tokenize" if rendered != PROBES[0] else "the server's chat endpoint"
    return Check("chat template", "pass", f"applied by {where}; answer {raw.text.strip()!r}")


_DETERMINISM_FIX = {
    "llama-cpp-python": "start it with --n_batch 1 --n_ubatch 1: llama.cpp computes a batch of prompt "
    "tokens with other kernels than one token, and its prompt cache decides which",
    "llama.cpp": "start it with -b 1 -ub 1 (batch-invariant prompt evaluation) and send "
    "cache_prompt=false",
    "vllm": "start it with --no-enable-prefix-caching, or run the eval with concurrency=1",
}


def _determinism_check(model: OpenAICompatModel) -> Check:
    cfg = GenerationConfig.greedy(max_new_tokens=16)
    a, b = (model.request_raw(PROBES[1], cfg)[0] for _ in range(2))
    fix = _DETERMINISM_FIX.get(
        model.profile.name, "make the server's numerics independent of batching and caching"
    )
    if a.tokens != b.tokens:
        return Check(
            "deterministic", "fail",
            f"two identical greedy requests gave {a.text!r} and {b.text!r}", fix,
        )  # fmt: skip
    worst = max((abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)), default=0.0)
    if worst > TOLERANCE:
        return Check(
            "deterministic", "warn",
            f"same answer, but its log-probs differ by {worst:.2g} between two identical requests",
            fix,
        )  # fmt: skip
    return Check("deterministic", "pass", f"identical answers, log-probs within {worst:.1e}")


_STREAMS_FIX = {
    "llama-cpp-python": "start it with --interrupt_requests false (by default it stops a running "
    "stream when another request arrives)",
}


def _streams_check(model: OpenAICompatModel, concurrency: int) -> Check:
    """``concurrency`` streamed greedy requests at once, each read to its end: every one must end
    with a ``finish_reason`` (a proxy, ``gnll serve --upstream``, streams its clients' requests so,
    and a stream cut short has no G-NLL)."""
    cfg = GenerationConfig.greedy(max_new_tokens=16)
    body: dict[str, Any] = {"model": model.name, **model.sampling_parameters(cfg)}
    if model.endpoint == "chat":
        path = "/chat/completions"
        body.update(messages=[{"role": "user", "content": PROBES[0]}])
        body[model.profile.max_tokens_key] = cfg.max_new_tokens
    else:
        path = "/completions"
        body.update(prompt=PROBES[0], max_tokens=cfg.max_new_tokens)
    start = threading.Barrier(concurrency)

    def one(_: int) -> str | None:
        """``None`` when the stream finished; otherwise what went wrong."""
        start.wait(timeout=30)
        try:
            events = model.client.events(path, body)
        except (ServerError, ServerUnavailable) as exc:
            return str(exc)
        chunks = [e for e in events if isinstance(e, dict)]
        if any("error" in c for c in chunks):
            return "an error event"
        if not any(c.get("finish_reason") for e in chunks for c in e.get("choices") or []):
            return "no finish_reason"
        return None

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        outcomes = list(pool.map(one, range(concurrency)))
    bad = [o for o in outcomes if o is not None]
    if not bad:
        return Check(
            "concurrent streams",
            "pass",
            f"{concurrency} streams at once all ended with a finish_reason",
        )
    fix = _STREAMS_FIX.get(
        model.profile.name, "make the server queue concurrent streams instead of cutting them"
    )
    reasons = sorted(set(bad))
    return Check(
        "concurrent streams",
        "fail",
        f"{len(bad)} of {concurrency} streams sent at once ended without finishing "
        f"({'; '.join(reasons)[:200]}): a proxy (gnll serve --upstream) in front of this server "
        "fails them",
        fix,
    )


def _speed_check(model: OpenAICompatModel, requests: int, concurrency: int) -> Check:
    cfg = GenerationConfig.greedy(max_new_tokens=16)
    prompts = [PROBES[i % len(PROBES)] for i in range(requests)]
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        raws = list(pool.map(lambda q: model.request_raw(q, cfg)[0], prompts))
    seconds = time.perf_counter() - start
    tokens = sum(len(r.tokens) for r in raws)
    return Check(
        "speed",
        "info",
        f"{requests / seconds:.2f} requests/s, {tokens / seconds:.1f} tokens/s at concurrency "
        f"{concurrency} ({requests} greedy requests)",
    )
