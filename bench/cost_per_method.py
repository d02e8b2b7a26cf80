"""Benchmark 2 -- cost per question of each uncertainty method, as a ratio to G-NLL.

For Q TriviaQA short prompts, the default model produces what each method needs, through the same
batched calls ``gnll eval`` makes (one ``generate`` call for all Q prompts, default batch size):

- G-NLL / LN-G-NLL: one greedy answer;
- BS-MSP: beam search with K=5 beams (+ the teacher-forced pass that scores the beams);
- PE / LN-PE: N=10 samples at temperature T (default 1.0);
- SE / LN-SE / D-SE / MCP: the same N=10 samples + semantic clustering by each clusterer:
  ``exact``; ``embedding`` (all-MiniLM-L6-v2); ``llm`` (entailment asked of the same SmolLM2);
  ``nli`` -- no NLI weights are available offline, so this is an NLIClusterer with the
  architecture of microsoft/deberta-large-mnli and random weights (identical compute per pair),
  whose verdicts are replaced after the forward pass by the embedding clusterer's clusters so that
  the partition asks as many pairs as a real clustering of these answers would.

Per method: wall time, generated tokens, LM forward calls (one pass over the weights each) and
processed positions (rows x columns, the compute) per question, plus clusterer model calls and
inputs, each with its ratio to G-NLL. Methods are interleaved over repetitions; medians reported.

Usage::

    python bench/cost_per_method.py --output bench/results/cost_per_method.json
    python bench/cost_per_method.py --quick --output /tmp/cost.json
"""

from __future__ import annotations

import statistics
import time
from typing import Any

import common
import torch

#: Size of microsoft/deberta-large-mnli (and a toy size for --quick).
DEBERTA = {
    "large": dict(
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
    ),
    "toy": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, intermediate_size=128),
}


def proxy_nli(size: str, oracle: Any) -> Any:
    """An NLIClusterer of the given DeBERTa size with random weights and borrowed verdicts."""
    from transformers import AutoTokenizer, DebertaConfig, DebertaForSequenceClassification

    from gnll.semantic import NLIClusterer, find_embedded_minilm

    id2label = {0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"}
    config = DebertaConfig(
        vocab_size=30522,  # MiniLM's BERT word-piece tokenizer stands in for DeBERTa's BPE
        max_position_embeddings=512,
        relative_attention=True,
        pos_att_type=["c2p", "p2c"],
        position_biased_input=False,
        num_labels=3,
        id2label=id2label,
        label2id={v: k for k, v in id2label.items()},
        **DEBERTA[size],
    )
    torch.manual_seed(0)
    model = DebertaForSequenceClassification(config)
    tokenizer = AutoTokenizer.from_pretrained(find_embedded_minilm())

    class ProxyNLI(NLIClusterer):
        #: (question, answer) -> cluster id under the oracle, filled per cluster_many call.
        meaning: dict[tuple[str, str], int] = {}

        def cluster_many(self, questions, list_of_answers):  # type: ignore[override]
            ids = oracle.cluster_many(questions, list_of_answers)
            self.meaning = {
                (q, a): c
                for q, answers, cs in zip(questions, list_of_answers, ids, strict=True)
                for a, c in zip(answers, cs, strict=True)
            }
            return super().cluster_many(questions, list_of_answers)

        def _predict_directional(self, triples):  # type: ignore[override]
            super()._predict_directional(triples)  # the real forward passes: the cost measured
            same = [
                self.meaning.get((q, a), -1) == self.meaning.get((q, b), -2) for q, a, b in triples
            ]
            return ["entailment" if s else "contradiction" for s in same]

    return ProxyNLI(model=model, tokenizer=tokenizer)


def reset(clusterer: Any) -> None:
    """Empty a clusterer's verdict/embedding caches so every repetition pays full price."""
    if hasattr(clusterer, "clear_cache"):
        clusterer.clear_cache()
    embedder = getattr(clusterer, "embedder", None)
    if embedder is not None and hasattr(embedder, "_cache"):
        embedder._cache.clear()
    fresh = type(clusterer.stats)()
    fresh.extra = dict.fromkeys(clusterer.stats.extra, 0)  # counters a clusterer expects to exist
    clusterer.stats = fresh


def main() -> None:
    ap = common.parser(__doc__)
    ap.add_argument("--questions", type=int, default=None, help="Q (default 20; quick 2)")
    ap.add_argument("--repeats", type=int, default=None)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--samples", type=int, default=None, help="N (default 10; quick 3)")
    ap.add_argument("--beams", type=int, default=None, help="K (default 5; quick 2)")
    ap.add_argument("--model", default=common.DEFAULT_MODEL)
    ap.add_argument("--clusterers", default="exact,embedding,nli,llm", help="comma list to include")
    args = ap.parse_args()
    common.setup_threads(args.threads)
    info = common.machine()
    from gnll import GenerationConfig, load_model
    from gnll.semantic import load_clusterer

    q = args.questions or (2 if args.quick else 20)
    args.samples = args.samples or (3 if args.quick else 10)
    args.beams = args.beams or (2 if args.quick else 5)
    repeats = args.repeats or (1 if args.quick else 3)
    model = load_model(args.model, progress=False)
    prompts = common.triviaqa_prompts(q)
    questions = common.triviaqa_questions(q)
    wanted = [c.strip() for c in args.clusterers.split(",") if c.strip()]
    clusterers: dict[str, Any] = {}
    load_s: dict[str, float] = {}
    for name in wanted:
        t = time.perf_counter()
        if name == "nli":
            clusterers[name] = proxy_nli(
                "toy" if args.quick else "large", load_clusterer("embedding")
            )
        elif name == "llm":
            clusterers[name] = load_clusterer("llm", model=model)
        else:
            clusterers[name] = load_clusterer(name)
        load_s[name] = time.perf_counter() - t

    configs = {
        "greedy": GenerationConfig.greedy(),
        "beam": GenerationConfig.beam(args.beams),
        "sample": GenerationConfig.sample(args.samples, temperature=args.temperature),
    }
    lm = model.model
    counter = common.ForwardCounter(lm)
    per: dict[str, list[dict[str, float]]] = {}

    def record(
        name: str, seconds: float, tokens: int, extra: dict[str, float] | None = None
    ) -> None:
        per.setdefault(name, []).append(
            {
                "seconds": seconds,
                "tokens": tokens,
                "lm_forward_calls": counter.calls,
                "lm_positions": counter.positions,
                "lm_forward_seconds": counter.seconds,
                **(extra or {}),
            }
        )

    for rep in range(repeats):
        samples = None
        for kind, cfg in configs.items():
            if kind == "sample":
                cfg = cfg.replace(seed=rep)
            counter.reset()
            t = time.perf_counter()
            gens = model.generate(prompts, cfg)
            dt = time.perf_counter() - t
            tokens = sum(len(g.token_ids) + len(g.terminator_token_ids) for gs in gens for g in gs)
            record(kind, dt, tokens)
            if kind == "sample":
                samples = gens
        answers = [[g.text for g in gs] for gs in samples]
        base = per["sample"][-1]
        for name, clusterer in clusterers.items():
            reset(clusterer)
            counter.reset()
            t = time.perf_counter()
            clusterer.cluster_many(questions, answers)
            dt = time.perf_counter() - t
            stats = clusterer.stats.to_dict()
            per.setdefault(f"cluster:{name}", []).append(
                {
                    "seconds": dt,
                    "lm_forward_calls": counter.calls,
                    "lm_positions": counter.positions,
                    "clusterer_model_calls": stats.get("model_calls", 0),
                    "clusterer_model_inputs": stats.get("model_inputs", 0),
                    "comparisons": stats.get("comparisons", 0),
                    "sample_seconds": base["seconds"],
                }
            )
        print(
            f"  repetition {rep + 1}/{repeats} done (load {common.load_average()[0]})", flush=True
        )
    counter.close()

    def med(name: str, key: str) -> float:
        return statistics.median(r.get(key, 0) for r in per[name])

    g = {k: med("greedy", k) / q for k in ("seconds", "tokens", "lm_forward_calls", "lm_positions")}
    rows: list[dict[str, Any]] = []

    # Where the time goes: per LM forward call, and the share of wall time spent inside them.
    forward_rows = []
    for kind in configs:
        fs = med(kind, "lm_forward_seconds")
        forward_rows.append(
            {
                "generation": kind,
                "LM forwards": med(kind, "lm_forward_calls"),
                "ms per forward": 1e3 * fs / max(1, med(kind, "lm_forward_calls")),
                "positions per forward": med(kind, "lm_positions")
                / max(1, med(kind, "lm_forward_calls")),
                "share of wall in forwards": fs / med(kind, "seconds"),
            }
        )

    def add(method: str, seconds: float, tokens: float, calls: float, positions: float, **kw: Any):
        rows.append(
            {
                "method": method,
                "s/question": seconds,
                "x G-NLL time": seconds / g["seconds"],
                "tokens/question": tokens,
                "x tokens": tokens / g["tokens"],
                "LM forwards/question": calls,
                "x forwards": calls / g["lm_forward_calls"],
                "LM positions/question": positions,
                "x positions": positions / g["lm_positions"],
                **kw,
            }
        )

    add(
        "G-NLL, LN-G-NLL (greedy)",
        g["seconds"],
        g["tokens"],
        g["lm_forward_calls"],
        g["lm_positions"],
    )
    add(
        f"BS-MSP ({args.beams} beams)",
        med("beam", "seconds") / q,
        med("beam", "tokens") / q,
        med("beam", "lm_forward_calls") / q,
        med("beam", "lm_positions") / q,
    )
    s = {k: med("sample", k) / q for k in ("seconds", "tokens", "lm_forward_calls", "lm_positions")}
    add(
        f"PE, LN-PE ({args.samples} samples)",
        s["seconds"],
        s["tokens"],
        s["lm_forward_calls"],
        s["lm_positions"],
    )
    for name in clusterers:
        key = f"cluster:{name}"
        cs = med(key, "seconds") / q
        add(
            f"SE, LN-SE, D-SE, MCP: samples + {name}",
            s["seconds"] + cs,
            s["tokens"],
            s["lm_forward_calls"] + med(key, "lm_forward_calls") / q,
            s["lm_positions"] + med(key, "lm_positions") / q,
            **{
                "clustering s/question": cs,
                "clusterer calls/question": med(key, "clusterer_model_calls") / q,
                "clusterer inputs/question": med(key, "clusterer_model_inputs") / q,
            },
        )
    cols = [
        "method",
        "s/question",
        "x G-NLL time",
        "tokens/question",
        "x tokens",
        "LM forwards/question",
        "x forwards",
        "x positions",
    ]
    print(common.table(rows, cols))
    print()
    print(
        common.table(
            [r for r in rows if "clustering s/question" in r],
            [
                "method",
                "clustering s/question",
                "clusterer calls/question",
                "clusterer inputs/question",
            ],
        )
    )
    print()
    print(common.table(forward_rows))
    info["peak_rss_mb"] = common.peak_rss_mb()
    common.finish(
        "cost_per_method",
        args,
        {
            "questions": q,
            "repeats": repeats,
            "temperature": args.temperature,
            "batch_size_rows": getattr(model, "batch_size", None),
            "clusterer_load_s": load_s,
            "table": rows,
            "forwards": forward_rows,
            "raw": per,
        },
        info,
    )


if __name__ == "__main__":
    main()
