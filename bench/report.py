"""Render the benchmark JSON files as the Markdown tables of BENCHMARKS.md.

Nothing in the generated section is typed by hand: every number comes from a ``bench/*.py`` run.

Usage::

    python bench/report.py --results bench/results                         # print
    python bench/report.py --results bench/results --update BENCHMARKS.md  # replace the section
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any

import common

START = "<!-- bench/report.py: start -->"
END = "<!-- bench/report.py: end -->"
ORDER = [
    "overhead",
    "cost_per_method",
    "throughput",
    "scaling",
    "simulation",
    "load_times",
    "profile_greedy",
    "profile_sampling",
    "beam_stage",
    "eval_speed",
    "eval_speed_equal_work",
    "prefix_attention",
    "serve_load",
    "serve_soak",
    "stop_split",
    "continuous_batching",
    "distributed",
    "early_decisions",
    "early_proxy_escalate",
    "early_inprocess_escalate",
    "decisions",
]
TITLES = {
    "overhead": "1. Overhead of scoring (greedy, gnll vs plain `model.generate`)",
    "cost_per_method": "2. Cost per question by method",
    "throughput": "3. Pipeline throughput (`gnll eval`, G-NLL only, vs one question at a time and vs plain "
    "transformers)",
    "scaling": "4. Scaling of `gnll eval` (G-NLL only)",
    "simulation": "5. Simulation study (`gnll simulate`)",
    "load_times": "Load times and tokens/second (issue 2)",
    "profile_greedy": "Where one batched greedy call spends its time",
    "profile_sampling": "Where one sampling call spends its time (10 answers per prompt, T = 1.5)",
    "beam_stage": "6. Beam stage: beam search in gnll's loop vs transformers' (issue 17.3a)",
    "eval_speed": "7. The whole default `gnll eval`, today vs the code issue 17 was filed on (issue 17.3c)",
    "eval_speed_equal_work": "7b. The same at equal work: one sampling temperature per task, today vs "
    "the code issue 17 was filed on",
    "prefix_attention": "What shared-prefix (cascade) attention could save: an upper bound (issue 17.3c)",
    "serve_load": "`gnll serve` under concurrent clients (dynamic batching) and proxy overhead",
    "serve_soak": "`gnll serve` soaked: 16 clients, mixed request kinds, in-process and proxy",
    "stop_split": "Cutting an answer at its stop string (`StopRules.split`), before/now",
    "continuous_batching": "Continuous batching vs fixed batches, greedy and sampling (issue 17.3b)",
    "distributed": "`gnll score` on Ray: overhead against the local engine, 1 vs 2 replicas",
    "early_decisions": "Exact early decisions: time to the escalate/refuse decision, early vs at the "
    "end of the answer (issue 37)",
    "early_proxy_escalate": "Proxy-mode escalation (llama.cpp SmolLM2 -> llama.cpp Gemma-3-270M): "
    "the client's time to the first escalated token, early vs at the end of the answer (issue 37)",
    "decisions": "Decisions: exact option probabilities vs first-token ones, calibration and the "
    "guarantee (issue 48)",
    "early_inprocess_escalate": "In-process cascade (gnll serve --model SmolLM2 -> llama.cpp "
    "Gemma-3-270M) at the calibrated threshold: the client's time to the first escalated token, "
    "early vs at the end of the answer (issue 37)",
}


def header(r: dict[str, Any]) -> list[str]:
    m = r["machine"]
    return [
        f"Command: `{r['command']}`  ",
        f"Machine: {m['cpu']}, {m['nproc']} cores; load average (1/5/15 min) at start "
        f"{m['load_average_start']}, at end {m.get('load_average_end')}; torch threads "
        f"{m['torch_threads']}" + (" -- QUICK RUN, not a figure" if r.get("quick") else ""),
        "",
    ]


def overhead(r: dict[str, Any]) -> list[str]:
    out = [f"{r['repeats']} interleaved repetitions per arm; medians.", ""]
    out += [common.table(r["table"]), ""]
    out += ["Bookkeeping alone per decode step (micro-benchmark):", ""]
    out += [common.table(r["bookkeeping"]), ""]
    out += ["cProfile of the gnll arm at the larger batch, top by own time:", "", "```"]
    out += r["profile"][:13] + ["```", ""]
    return out


def cost(r: dict[str, Any]) -> list[str]:
    cols = [
        "method",
        "s/question",
        "x G-NLL time",
        "tokens/question",
        "x tokens",
        "LM forwards/question",
        "x forwards",
        "LM positions/question",
        "x positions",
    ]
    out = [
        f"{r['questions']} TriviaQA questions, {r['repeats']} interleaved repetitions (medians), "
        f"sampling temperature {r['temperature']}, batch size {r['batch_size_rows']} rows.",
        "",
        common.table(r["table"], cols),
        "",
        common.table(
            [x for x in r["table"] if "clustering s/question" in x],
            [
                "method",
                "clustering s/question",
                "clusterer calls/question",
                "clusterer inputs/question",
            ],
        ),
        "",
        "Where the generation time goes (LM forward calls, medians over repetitions):",
        "",
        common.table(r.get("forwards", [])),
        "",
        "Clusterer load times (s): "
        + ", ".join(f"{k} {v:.1f}" for k, v in r["clusterer_load_s"].items()),
        "",
    ]
    return out


def _throughput_pairs(r: dict[str, Any]) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(baseline arm, its speed-ups, agreement) per baseline; older results had only the loop."""
    s = r["summary"]
    if "agreement_eval_vs_loop" in s:
        return [("loop", {**s, "target": 5.0}, s["agreement_eval_vs_loop"])]
    return [(a, s[a], s["agreement"][a]) for a in r["arms"] if a != "eval"]


def throughput(r: dict[str, Any]) -> list[str]:
    out = [
        f"{r['n']} questions, {r['repeats']} interleaved repetitions (medians).",
        "",
        common.table(r["table"]),
        "",
    ]
    for arm, sp, a in _throughput_pairs(r):
        out += [
            f"Speed-up eval/{arm} (median of paired runs): end-to-end "
            f"**{sp['speedup_end_to_end_median']:.2f}x**, generation only "
            f"**{sp['speedup_generation_median']:.2f}x**"
            + (f" (target >= {sp['target']:g}x)" if sp.get("target") else "")
            + ". Same "
            f"answers in {a['same_text']}/{a['n']} questions, max |G-NLL difference| "
            f"{a['max_abs_g_nll_diff']:.2g}"
            + (
                f"; same rendered prompts {a['same_prompts']}/{a['n']}"
                if "same_prompts" in a
                else ""
            )
            + ".",
            "",
        ]
    return out


def scaling(r: dict[str, Any]) -> list[str]:
    s = r["summary"]
    return [
        common.table(r["table"]),
        "",
        f"Fit: wall = {s['fit_wall_s']['intercept_s']:.1f} s + "
        f"{s['fit_wall_s']['slope_s_per_question']:.3f} s x N (largest residual "
        f"{s['max_rel_residual_of_fit']:.1%}). Generation s/question max/min "
        f"**{s['generation_per_question_spread']:.3f}** (target <= 1.15: "
        f"{'met' if s['time_linear_within_15pct'] else 'MISSED'}); peak RSS max/min "
        f"**{s['rss_max_over_min']:.3f}** (target <= 1.10: "
        f"{'met' if s['memory_flat_within_10pct'] else 'MISSED'}).",
        "",
    ]


def simulation(r: dict[str, Any]) -> list[str]:
    out: list[str] = []
    if "full_run" in r:
        fr = r["full_run"]
        out += [
            f"Full default run: **{fr['wall_s']:.0f} s** wall ({fr['user_s']:.0f} s user CPU), "
            f"peak RSS {fr['peak_rss_mb']:.0f} MB (largest process), load before/after "
            f"{fr['load_before'][0]}/{fr['load_after'][0]}.",
            "",
            common.table([{"setting": k, "seconds": v} for k, v in fr["settings_s"].items()]),
            "",
        ]
    p = r["profile_v100_t4"]
    out += [
        f"cProfile of V=100, T=4 ({p['with_theory']['count']} distributions with the Theorem-1 "
        f"check, {p['without_theory']['count']} without; shares extrapolated to the full setting "
        f"of {p['config']['distributions']}; leaf pool built in "
        f"{p['with_theory']['pool_s']:.1f} s):",
        "",
        common.table(r["table"]),
        "",
        f"Exact values take **{p['exact_share']:.1%}** of the setting; the largest component is "
        f"**{p['bottleneck']}**.",
        "",
    ]
    return out


def load_times(r: dict[str, Any]) -> list[str]:
    return [
        common.table(r["loads"]),
        "",
        f"In-process cached load of the default model (in the benchmark process): "
        f"{r['in_process_cached_load_s']:.2f} s.",
        "",
        common.table(r["tokens_per_second"]),
        "",
    ]


def profile_greedy(r: dict[str, Any]) -> list[str]:
    return [
        "Prefill forwards have more than one column; the rest are decode steps.",
        "",
        common.table(r["table"]),
        "",
        "cProfile, top by own time:",
        "",
        "```",
        *r["profile"],
        "```",
        "",
    ]


def beam_stage(r: dict[str, Any]) -> list[str]:
    s, a = r["summary"], r["summary"]["agreement"]
    return [
        common.table(r["table"]),
        "",
        f"Speed-up generate/loop (median of paired runs): **{s['speedup_median_paired']:.2f}x** "
        f"(target >= {s['target']:g}x). Same beams (token ids, order) for {a['same_beams']}/{a['n']}"
        f" prompts, max |log-prob difference| {a['max_abs_logprob_diff']:.2g}.",
        "",
    ]


def eval_speed(r: dict[str, Any]) -> list[str]:
    s = r["summary"]
    ref = s.get("reference", "after")
    lines = [common.table(r["table"]), ""]
    for arm, ratios in s["speedups"].items():
        st = ", ".join(f"{k.split()[0]} {v:.2f}x" for k, v in s["stage_speedups"][arm].items())
        lines.append(f"- {ref} vs {arm}: **{statistics.median(ratios):.2f}x** per question ({st})")
    for arm, same in s["identical"].items():
        lines.append(
            f"- identical outputs, {ref} vs {arm}: "
            + ", ".join(f"{k.removeprefix('same_')} {v}" for k, v in same.items() if k != "n")
            + f" (of {same['n']} questions)"
        )
    met = "met" if s["met"] else "**not met**"
    lines += ["", f"Target ({ref} vs {s['baseline']}, >= {s['target']:g}x): {met}.", ""]
    return lines


def serve_load(r: dict[str, Any]) -> list[str]:
    s = r["summary"]
    a = s["agreement_with_eval"]
    return [
        f"{r['n']} TriviaQA short prompts per arm, {r['repeats']} interleaved repetitions "
        "(medians; latencies pooled).",
        "",
        common.table(r["table"]),
        "",
        f"At {s['reference_arm'][1:]} clients: **{s['speedup_vs_one_at_a_time']:.3f}x** the "
        f"one-at-a-time throughput (target >= 4x) and **{s['ratio_to_eval']:.2f}x** `gnll eval`'s "
        f"questions/s (target >= 0.8x). Answers equal to `gnll eval`'s in {a['same_text']}/{a['n']}, "
        f"max |G-NLL difference| {a['max_abs_g_nll_diff']:.2g}.",
        *(
            [
                "",
                f"`gnll eval` itself, 16 rows at a time (`--batch_size 16`, every prompt queued up "
                f"front): **{s['eval16_to_eval']:.2f}x** its questions/s at its default width; "
                f"{s['reference_arm'][1:]} clients reach **{s['ratio_to_eval16']:.2f}x** that.",
            ]
            if s.get("eval16_to_eval") is not None
            else []
        ),
        "",
        "Proxy (`gnll serve --upstream`) vs the same server called directly, one request at a time:",
        "",
        common.table(r["proxy"]),
        "",
        f"Overhead at p50: **{100 * s['proxy_overhead_p50']:.1f}%** (median of paired ratios "
        f"{100 * s['proxy_overhead_paired_median']:.1f}%; target <= 5%).",
        "",
    ]


def serve_soak(r: dict[str, Any]) -> list[str]:
    rows = []
    for mode, m in r["modes"].items():
        lat = m["latency"]
        memory = "; ".join(
            f"{name} {g['rss_after_warmup_mb']:.0f} -> {g['rss_end_mb']:.0f} MB "
            f"({g['slope_mb_per_min']:+.2f} MB/min, "
            f"{m['memory_mb_per_1000_requests'].get(name, 0):+.2f} MB per 1,000 requests)"
            for name, g in m["memory"].items()
            if g
        )
        rows.append(
            {
                "mode": mode,
                "minutes": round(m["seconds"] / 60, 1),
                "requests": m["requests"],
                "errors": m["errors"],
                "lost": sum(m["lost"].values()),
                "duplicated": m["duplicate_answer_ids"],
                "req/s": m["throughput_rps"],
                "p50 s": lat["all"]["p50_s"],
                "p99 s": lat["all"]["p99_s"],
                "stream p50 / p99 s": f"{lat['chat-stream']['p50_s']} / {lat['chat-stream']['p99_s']}",
                "server memory after warm-up": memory,
            }
        )
    return [
        f"Model `{r['model']}`; {next(iter(r['modes'].values()))['clients']} clients, each cycling "
        "completions, chat, chat stream and completions stream (greedy, at most "
        "16 tokens). Every response and chunk validated with the `openai` types; 'lost' counts "
        "requests without exactly one entry in each server's access log; memory is each server "
        "process's RSS after the first quarter of the run, with a least-squares slope.",
        "",
        common.table(rows),
        "",
        "The modes run one after the other, so on a host shared with other work (see the load "
        "average above) their latencies and throughputs are not comparable with each other; the "
        "counts and the memory are what the run checks.",
        "",
    ]


def continuous_batching(r: dict[str, Any]) -> list[str]:
    return [
        f"{r['n']} TriviaQA prompts, {r['repeats']} interleaved repetitions per arm; medians.",
        "",
        common.table(r["table"]),
        "",
        "Greedy: 64 prompts fill one 64-row batch, so nothing waits and nothing can join; with more "
        "prompts than rows the greedy stage gains too (section 3, `eval` vs `eval-chunk64`). "
        "Sampling: 10 rows per prompt, six prompts per batch; continuous batching keeps the batch "
        "full while the long samples of a batch finish. Sampled sequences that differ do so by "
        "float noise (another padding moves logits in the last digits).",
        "",
    ]


def _early_sweep(sweep: list[dict[str, Any]] | None) -> list[str]:
    """Where the exact decision comes as the threshold moves (the full answers' token NLLs)."""
    if not sweep:
        return []
    rows = [
        {
            "escalated": f"{x['escalated_share']:.0%}",
            "threshold (G-NLL)": x["threshold_g_nll"],
            "tokens to the decision": x["tokens_to_decision"],
            "tokens of the full answers": x["tokens_full"],
            "early/full": x["tokens_ratio"],
            "median share of an answer generated": x["median_paired_share"],
        }
        for x in sweep
    ]
    met = [x for x in sweep if x["tokens_ratio"] is not None and x["tokens_ratio"] <= 0.5]
    where = (
        f"at or under half of the escalated answers' tokens from a threshold escalating "
        f"{min(x['escalated_share'] for x in met):.0%} of the answers"
        if met
        else "above half of the escalated answers' tokens at every threshold of the sweep"
    )
    return [
        "",
        "The same questions at other thresholds (no timing: from the full answers' token NLLs, "
        "the first token at which the running G-NLL passes each threshold; thresholds at the "
        "G-NLL quantiles that escalate 10% ... 90% of these answers):",
        "",
        common.table(rows),
        "",
        f"Reading: an exact decision comes where the running sum passes the threshold, so the "
        f"lower the threshold, the earlier in an answer; here it comes {where}. No exact rule can "
        "decide sooner: before that token the answer may still end with a G-NLL at or under the "
        "threshold.",
    ]


def early_decisions(r: dict[str, Any]) -> list[str]:
    rows = []
    policies = {k: v for k, v in r["summary"].items() if k != "sweep"}
    for name, s in policies.items():
        hit = [q for q in r["per_question"] if q[name]["end_decision"]]
        share = (
            statistics.median(q[name]["tokens"] / q["full"]["tokens"] for q in hit) if hit else None
        )
        rows.append(
            {
                "policy": f"{name}: {s['policy']['source']}",
                "abstained": f"{s['abstained']}/{s['questions']}",
                "decided early": s["decided_early"],
                "decision changes": s["decision_changes"],
                "mean s to decision, early": s["mean_s_to_decision_early"],
                "mean s, full answer": s["mean_s_to_decision_full"],
                "early/full": s["ratio_of_means"],
                "median paired ratio": s["median_paired_ratio"],
                "tokens early": s["tokens_abstained_early"],
                "tokens full": s["tokens_abstained_full"],
                "median share of the answer generated": share,
            }
        )
    total = policies[next(iter(policies))]
    partial = (
        f" The run was stopped after {total['questions']} of the 200 questions it was started on "
        "(a 2-core host shared with eight other sessions; the script writes a checkpoint every 20 "
        "questions): the figures are those questions'."
        if r.get("partial")
        else ""
    )
    esc = policies.get("escalate") or total
    esc_name = "escalate" if "escalate" in policies else next(iter(policies))
    esc_share = next(x for x in rows if x["policy"].startswith(f"{esc_name}:"))[
        "median share of the answer generated"
    ]
    reading = (
        f" Reading: early decisions changed {esc['decision_changes']} decisions. An exact decision "
        "comes at the first token at which the running G-NLL passes the threshold; under the "
        f"calibrated rule (which escalated {esc['abstained']} of {esc['questions']} answers) "
        + (
            f"that is a median {esc_share:.0%} of the way through an escalated answer"
            if esc_share
            else "no answer was escalated"
        )
        + ". A request's time also holds what early decisions cannot save (the prompt's prefill, "
        "the request's own costs), so the time saved is a little smaller than the tokens saved."
    )
    return [
        f"{total['questions']} `{r['task']}` questions, {r['model']}, one request at a time "
        "through the serving engine; per question the arms run back to back in rotating order "
        "(full answer, then each policy with early decisions). The times and tokens are over the "
        "answers the policy refuses/escalates (the end-of-answer decision); a decision change "
        "is any question whose early-decision arm decides otherwise than the full answer's G-NLL. "
        "The escalate arm's calibration was fitted on the model's own answers to the questions "
        "before these (the script's docstring has the commands; a SmolLM2 -> Gemma-3-270M "
        "cascade threshold cannot be fitted on this task, where Gemma answers fewer questions "
        "right)." + partial,
        "",
        common.table(rows),
        "",
        reading.strip(),
        *_early_sweep(r["summary"].get("sweep")),
        "",
    ]


def early_proxy_escalate(r: dict[str, Any]) -> list[str]:
    return [
        f"`{r['task']}` questions through two `gnll serve --upstream` proxies (SmolLM2 on "
        f"llama-cpp-python) escalating above G-NLL {r['threshold']:g} to Gemma-3-270M on "
        "llama-cpp-python, one `--early`, one `--no-early`; per question both arms in rotating "
        "order, each a streamed openai SDK request (held until SmolLM2's answer is decided; an "
        "escalated one then streams live from Gemma). `unscored`: SmolLM2's answer was empty, "
        "which llama-cpp-python gives no log-prob for (502 in both arms). "
        + _escalate_common(r)[0],
        *_escalate_common(r)[1:],
    ]


def early_inprocess_escalate(r: dict[str, Any]) -> list[str]:
    return [
        f"`{r['task']}` questions (the prompts `gnll eval` renders for SmolLM2) through two "
        "`gnll serve --model smollm2-135m-instruct` processes (SmolLM2 in-process) escalating "
        f"above G-NLL {r['threshold']:g} (the threshold of "
        "`bench/calibrations/smollm2-triviaqa_long.json`) to Gemma-3-270M on llama-cpp-python, "
        "one `--early`, one `--no-early`; per question both arms in rotating order, each a "
        "streamed openai SDK request (held until SmolLM2's answer is decided; an escalated one "
        "then streams live from Gemma). " + _escalate_common(r)[0],
        *_escalate_common(r)[1:],
    ]


def _escalate_common(r: dict[str, Any]) -> list[str]:
    s = r["summary"]
    row = {
        "questions": s["questions"],
        "unscored": s["unscored"],
        "escalated": s["escalated"],
        "decided early": s["decided_early"],
        "decision changes": s["decision_changes"],
        "mean s to 1st escalated chunk, early": s.get("mean_first_escalated_s_early"),
        "mean s, wait": s.get("mean_first_escalated_s_wait"),
        "early/wait (means)": s.get("ratio_of_means"),
        "median s, early": s.get("median_first_escalated_s_early"),
        "median s, wait": s.get("median_first_escalated_s_wait"),
        "median paired ratio": s.get("median_paired_ratio"),
        "SmolLM2 tokens on escalated, early": s.get("small_tokens_escalated_early"),
        "SmolLM2 tokens on escalated, wait": s.get("small_tokens_escalated_wait"),
    }
    return [
        "Times over the questions escalated in both arms; "
        f"{s['same_escalated_text']} of {s['escalated']} escalated answers were the same text "
        f"in both arms; SmolLM2 generated {s['small_tokens_early']} answer tokens in all with "
        f"early decisions, {s['small_tokens_wait']} waiting.",
        "",
        common.table([row]),
        "",
        *_proxy_escalate_reading(s),
    ]


def _proxy_escalate_reading(s: dict[str, Any]) -> list[str]:
    if not s.get("escalated"):
        return []
    saved = s["mean_first_escalated_s_wait"] - s["mean_first_escalated_s_early"]
    share = s["small_tokens_escalated_early"] / s["small_tokens_escalated_wait"]
    return [
        f"Reading: {s['decision_changes']} decision changes; on the escalated questions SmolLM2 "
        f"generated {share:.0%} of the tokens it generates when gnll waits for the end, and the client "
        f"got the escalated answer {saved:.2f} s sooner on average. The rest of the time to the "
        "first escalated token is the larger model's time to its first token (its answer streams "
        "live), the same in both arms, which early decisions cannot shorten.",
        "",
    ]


def decisions(r: dict[str, Any]) -> list[str]:
    s = r["summary"]
    per_model = ", ".join(
        f"{m['model']} {m['questions']} of {m.get('questions_asked', m['questions'])}"
        for m in r["models"]
    )
    out = [
        f"{s['n']} four-option questions generated from the embedded TriviaQA and SVAMP samples "
        f"(gold answer + three other questions' answers, seed {s['seed']}); questions decided: "
        f"{per_model}. One `gnll.decide` call per question gives both methods (same forward pass): "
        "**exact** (every token of every option) and **first-token** (each option's first token "
        "only). AUROC/ECE of the chosen option's probability as P(correct); *calibrated*: "
        "isotonic/Platt on -log p, held-out by 5-fold CV. Violations: share of "
        f"{s['splits']} random 50/50 calibration/test splits on which the Learn-then-Test threshold "
        f"(accuracy >= 1 - a w.p. >= 1 - {s['delta']}) had test accuracy among answered below 1 - a "
        "(must be <= delta); coverage: mean share of test questions answered.",
        "",
        common.table(r["table"]),
        "",
        "Time per decision (all four options, one call) vs one greedy answer to the same question "
        "(instruction prompt, up to 32 tokens), interleaved, on every tenth question; the share of "
        "questions with a multi-token option, and with two options that share their first token "
        "(the first-token method cannot tell those apart):",
        "",
        common.table(r["timing"]),
        "",
    ]
    return out


def stop_split(r: dict[str, Any]) -> list[str]:
    longest = ", ".join(f"{name} {ratio:.1f}x" for name, ratio in r["summary"].items())
    return [
        f"{r['repeats']} interleaved repetitions per arm; medians. Before: decoding every prefix of "
        "the answer; now: `StopRules.prefix_lengths` (the same results, checked in "
        "`tests/backends/test_backend_stopping.py`).",
        "",
        common.table(r["table"]),
        "",
        f"Before/now at the longest answer: {longest}.",
        "",
    ]


def prefix_attention(r: dict[str, Any]) -> list[str]:
    [row] = r["table"]
    return [
        f"One-token decode steps of the real model, {row['rows']} rows, on an in-place cache, with "
        f"the prefix and the answer cached ({row['prefix tokens']} + {row['answer tokens']} positions "
        f"per row) and with the answer alone; medians. The difference is all a step spends on the "
        "prefix; cascade attention would still read it once per prompt.",
        "",
        common.table(r["table"]),
        "",
        f"Best case for cascade attention: a decode step **{row['step speed-up bound']:.2f}x** "
        "faster, before the rest of a sampling call (prefill, selection) and of the run (greedy, "
        "beams, clustering) dilute it.",
        "",
    ]


def distributed(r: dict[str, Any]) -> list[str]:
    rows = [
        {
            "arm": k,
            "median s (model load included)": f"{v:.1f}",
            "rows/s": f"{r['rows_per_s'][k]:.1f}",
        }
        for k, v in r["median_s"].items()
    ]
    return [
        f"{r['rows']} TriviaQA (question, gold answer) rows scored by {r['model']}, chunks of "
        f"{r['chunk_size']}; {r['repeats']} interleaved repetition(s) per arm; T = {r['threads']} "
        "threads. `local`: the local engine; `ray_1xT`: Ray, one replica of T threads; "
        "`ray_1x1`/`ray_2x1`: one and two replicas of one thread.",
        "",
        common.table(rows),
        "",
        f"Ray's overhead against the local engine at T threads: **{r['ray_overhead']:+.0%}** "
        f"(target <= 10%). One to two single-thread replicas: **{r['speedup_2_vs_1']:.2f}x**, "
        f"scaling efficiency **{r['scaling_efficiency']:.2f}** (target >= 0.85). Outputs of "
        f"`local` and `ray_1xT` byte-identical: {r['local_equals_ray_bytes']}.",
        "",
        (
            "The machine was oversubscribed (1-minute load above its core count): two-thread arms "
            "suffer most from other jobs' contention, so these ratios are no verdict on Ray's "
            "overhead or scaling; rerun on a quiet machine (`bench/run_all.sh` waits for one)."
            if r["machine"]["load_average_start"][0] > r["machine"]["nproc"]
            else ""
        ),
        "",
        "Projection (not a measurement) from the single-thread replica's rate and the measured "
        "efficiency, as `docs/distributed.md` sizes a cluster:",
        "",
        common.table(r["sizing"]) if "sizing" in r else "",
        "",
    ]


RENDER = {
    "overhead": overhead,
    "cost_per_method": cost,
    "throughput": throughput,
    "scaling": scaling,
    "simulation": simulation,
    "load_times": load_times,
    "profile_greedy": profile_greedy,
    "profile_sampling": profile_greedy,
    "beam_stage": beam_stage,
    "eval_speed": eval_speed,
    "eval_speed_equal_work": eval_speed,
    "prefix_attention": prefix_attention,
    "serve_load": serve_load,
    "serve_soak": serve_soak,
    "stop_split": stop_split,
    "continuous_batching": continuous_batching,
    "distributed": distributed,
    "early_decisions": early_decisions,
    "early_proxy_escalate": early_proxy_escalate,
    "early_inprocess_escalate": early_inprocess_escalate,
    "decisions": decisions,
}


def summary_rows(found: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per target of issue 6, read from the results."""
    rows: list[dict[str, Any]] = []

    def add(bench: str, target: str, value: str, met: bool | None, below: str = "MISSED") -> None:
        status = "n/a" if met is None else ("met" if met else below)
        rows.append({"benchmark": bench, "target": target, "measured": value, "status": status})

    if "overhead" in found:
        for row in found["overhead"]["table"]:
            add(
                "1 overhead",
                f"gnll/plain <= 1.03 at batch {row['batch']}",
                f"{row['gnll/plain']:.3f}",
                row["gnll/plain"] <= 1.03,
            )
    if "cost_per_method" in found:
        for row in found["cost_per_method"]["table"]:
            if row["method"].startswith("SE"):
                add(
                    "2 cost",
                    f"{row['method'].split(': ')[-1]}: >= 10x G-NLL time (expected)",
                    f"{row['x G-NLL time']:.1f}x time, {row['x tokens']:.1f}x tokens",
                    row["x G-NLL time"] >= 10,
                    # An expectation to explain, not a speed target: see "Reading the figures".
                    below="below: explained under Reading the figures",
                )
    if "throughput" in found:
        for arm, sp, _ in _throughput_pairs(found["throughput"]):
            if not sp.get("target"):
                continue  # an informative arm (eval-chunk64), no target
            add(
                "3 throughput",
                f"eval >= {sp['target']:g}x {arm} (questions/s, end to end)",
                f"{sp['speedup_end_to_end_median']:.2f}x (generation only "
                f"{sp['speedup_generation_median']:.2f}x)",
                sp["met_end_to_end"],
            )
    if "beam_stage" in found:
        s = found["beam_stage"]["summary"]
        add(
            "6 beam stage",
            "beam loop >= 2x transformers' beam search, same beams",
            f"{s['speedup_median_paired']:.2f}x; same beams {s['agreement']['same_beams']}/"
            f"{s['agreement']['n']}",
            s["met"] and s["agreement"]["same_beams"] == s["agreement"]["n"],
        )
    for name, target in (
        ("eval_speed", "default gnll eval >= 2x faster per question, identical outputs"),
        (
            "eval_speed_equal_work",
            "(diagnostic) the same at equal work: one sampling temperature per task",
        ),
    ):
        if name in found:
            s = found[name]["summary"]
            add("7 whole eval", target, f"{s['speedup_median']:.2f}x", s["met"])
    if "early_decisions" in found:
        s = found["early_decisions"]["summary"]["escalate"]
        ratio = s["ratio_of_means"]
        add(
            "early decisions",
            "escalated answers decided in <= 50% of the full local answer's time; 0 changes",
            f"{ratio:.2f} of the time; {s['decision_changes']} changes"
            if ratio is not None
            else "no escalation",
            None if ratio is None else ratio <= 0.5 and s["decision_changes"] == 0,
        )
    if "scaling" in found:
        s = found["scaling"]["summary"]
        add(
            "4 scaling",
            "time linear within 15% (generation s/question max/min)",
            f"{s['generation_per_question_spread']:.3f}",
            s["time_linear_within_15pct"],
        )
        add(
            "4 scaling",
            "peak memory flat within 10% (max/min)",
            f"{s['rss_max_over_min']:.3f}",
            s["memory_flat_within_10pct"],
        )
    if "simulation" in found:
        r = found["simulation"]
        p = r["profile_v100_t4"]
        full = r.get("full_run", {}).get("wall_s")
        add(
            "5 simulation",
            "exact enumeration not the bottleneck at V=100, T=4",
            f"exact values {p['exact_share']:.1%} of the setting; largest: {p['bottleneck']}"
            + (f"; full run {full:.0f} s" if full else ""),
            not p["exact_is_bottleneck"],
        )
    if "serve_load" in found:
        s = found["serve_load"]["summary"]
        add(
            "serve",
            "16 clients >= 4x one-at-a-time (requests/s)",
            f"{s['speedup_vs_one_at_a_time']:.3f}x",
            s["met_speedup"],
        )
        add(
            "serve",
            "16 clients >= 0.8x gnll eval's questions/s",
            f"{s['ratio_to_eval']:.3f}x",
            s["met_eval"],
        )
        add(
            "serve",
            "proxy overhead <= 5% at p50",
            f"{100 * s['proxy_overhead_p50']:.1f}%",
            s["met_proxy"],
        )
    return rows


def render(results: Path) -> str:
    found = {
        n: json.loads((results / f"{n}.json").read_text())
        for n in ORDER
        if (results / f"{n}.json").exists()
    }
    lines = [START, ""]
    if found:
        # Sessions may land on different hosts: every section names its own CPU (see header()).
        cpus = sorted({r["machine"]["cpu"] for r in found.values()})
        m = next(iter(found.values()))["machine"]
        lines += [
            f"Machines: {' / '.join(cpus)}; {m['nproc']} cores, {m['mem_total_gb']} GB RAM; Python "
            f"{m['python']}, torch {m['torch']}, transformers {m['transformers']}.",
            "",
        ]
    targets = summary_rows(found)
    if targets:
        lines += ["### Targets at a glance", "", common.table(targets), ""]
    for name in ORDER:
        if name not in found:
            continue
        lines += [f"### {TITLES[name]}", ""] + header(found[name]) + RENDER[name](found[name])
    lines.append(END)
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--results", type=Path, default=Path("bench/results"))
    ap.add_argument("--update", type=Path, default=None, help="Markdown file to update in place")
    args = ap.parse_args()
    text = render(args.results)
    if args.update is None:
        print(text)
        return
    doc = args.update.read_text() if args.update.exists() else ""
    if START in doc and END in doc:
        doc = doc[: doc.index(START)] + text + doc[doc.index(END) + len(END) :]
    else:
        doc = doc.rstrip() + "\n\n" + text + "\n"
    args.update.write_text(doc)
    print(f"updated {args.update}")


if __name__ == "__main__":
    main()
