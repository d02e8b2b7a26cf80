"""Choose the cosine threshold of the embedding clusterer with evidence from TriviaQA.

Ground truth without an NLI model or human labels: TriviaQA lists several *aliases* of each gold
answer ("Sir Henry Campbell-Bannerman", "Campbell Bannerman", ...), which are spellings of one
meaning, while the answers to *different* questions are different meanings. For each target question
we build a set of N answers (default 10, as for SE) that mixes 1-4 meanings:

- meaning 0: aliases of the question's own gold answer;
- meanings 1..: aliases of the gold answers of *similar* questions (nearest neighbours of the
  question text under the same embedding model) -- hard negatives of the same type, e.g. another
  prime minister;
- answers are drawn with repetition (as samples repeat), and a share of them is wrapped in a short
  sentence ("The answer is X.") as in long-form answers, for every meaning alike.

For each threshold on a grid we cluster every set with :class:`gnll.semantic.EmbeddingClusterer` and
measure agreement with the ground-truth meanings (adjusted Rand index, pairwise precision/recall,
error of discrete semantic entropy), alongside the exact-match clusterer as the lexical floor; we
also report agreement with exact-match clustering itself (the literal criterion of the issue). The
threshold is chosen on a dev split -- the highest threshold whose mean ARI against the ground truth
is within one standard error of the best (the one-standard-error rule, on the side that merges
less) -- and reported on a disjoint test split.

Usage::

    python bench/choose_embedding_threshold.py --output results/embedding_threshold.json
    python bench/choose_embedding_threshold.py --quick --output /tmp/t.json   # smoke run
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import numpy as np
from sklearn.metrics import adjusted_rand_score

from gnll.measures import discrete_semantic_entropy
from gnll.semantic import EmbeddingClusterer, ExactClusterer, SentenceEmbedder
from gnll.text import normalize_answer

DEFAULT_DATA = (
    Path(os.environ.get("GNLL_DATA_DIR", "."), "triviaqa", "triviaqa_unfiltered_validation.jsonl")
)
TEMPLATES = ("The answer is {a}.", "It is {a}.", "I think it's {a}.", "{a} is the answer.")


def clean_aliases(aliases: list[str], max_len: int = 40) -> list[str]:
    """Aliases without Wikipedia disambiguation clutter, one per normalised form."""
    seen: dict[str, str] = {}
    for a in aliases:
        a = a.strip()
        if not a or "(" in a or len(a) > max_len:
            continue
        key = normalize_answer(a)
        if key and key not in seen:
            seen[key] = a
    return list(seen.values())


def load_questions(path: Path, pool_size: int, seed: int) -> list[dict]:
    rows = []
    with path.open() as fh:
        for line in fh:
            row = json.loads(line)
            aliases = clean_aliases(row["aliases"])
            if aliases:
                rows.append({"question": row["question"].strip(), "aliases": aliases})
    rng = random.Random(seed)
    rng.shuffle(rows)
    return rows[:pool_size]


def build_sets(
    pool: list[dict],
    targets: list[int],
    neighbours: np.ndarray,
    n_answers: int,
    p_sentence: float,
    seed: int,
) -> list[dict]:
    rng = random.Random(seed)
    sets = []
    for t in targets:
        own = {normalize_answer(a) for a in pool[t]["aliases"]}
        groups = [pool[t]["aliases"]]
        n_groups = rng.randint(1, 4)
        for j in neighbours[t]:
            if len(groups) == n_groups:
                break
            keys = {normalize_answer(a) for a in pool[j]["aliases"]}
            if (
                j != t
                and not (keys & own)
                and all(not (keys & {normalize_answer(a) for a in g}) for g in groups)
            ):
                groups.append(pool[j]["aliases"])
        # Every meaning appears at least once; the rest favour the first (the "modal" answer).
        labels = list(range(len(groups)))
        weights = np.array([2.0] + [1.0] * (len(groups) - 1))
        labels += list(
            rng.choices(range(len(groups)), weights=weights.tolist(), k=n_answers - len(groups))
        )
        rng.shuffle(labels)
        answers = []
        for g in labels:
            a = rng.choice(groups[g])
            if rng.random() < p_sentence:
                a = rng.choice(TEMPLATES).format(a=a)
            answers.append(a)
        sets.append({"question": pool[t]["question"], "answers": answers, "truth": labels})
    return sets


def pair_counts(pred: list[int], truth: list[int]) -> tuple[int, int, int]:
    """(true positives, predicted positives, actual positives) over unordered answer pairs."""
    p = np.asarray(pred)
    t = np.asarray(truth)
    iu = np.triu_indices(len(p), k=1)
    same_p = (p[:, None] == p[None, :])[iu]
    same_t = (t[:, None] == t[None, :])[iu]
    return int((same_p & same_t).sum()), int(same_p.sum()), int(same_t.sum())


def evaluate(pred: list[list[int]], sets: list[dict], exact: list[list[int]]) -> dict:
    ari = [adjusted_rand_score(s["truth"], p) for s, p in zip(sets, pred, strict=True)]
    ari_exact = [adjusted_rand_score(e, p) for e, p in zip(exact, pred, strict=True)]
    tp = pp = ap = 0
    dse_err = []
    for s, p in zip(sets, pred, strict=True):
        a, b, c = pair_counts(p, s["truth"])
        tp, pp, ap = tp + a, pp + b, ap + c
        dse_err.append(abs(discrete_semantic_entropy(p) - discrete_semantic_entropy(s["truth"])))
    precision = tp / pp if pp else 1.0
    recall = tp / ap if ap else 1.0
    return {
        "ari_truth": float(np.mean(ari)),
        "ari_truth_se": float(np.std(ari, ddof=1) / np.sqrt(len(ari))),
        "ari_exact": float(np.mean(ari_exact)),
        "pair_precision": precision,
        "pair_recall": recall,
        "pair_f1": 2 * precision * recall / (precision + recall) if precision + recall else 0.0,
        "dse_abs_error": float(np.mean(dse_err)),
        "mean_clusters": float(np.mean([len(set(p)) for p in pred])),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--data", type=Path, default=DEFAULT_DATA)
    ap.add_argument("--output", type=Path, required=True, help="where to write the JSON results")
    ap.add_argument("--questions", type=int, default=400, help="questions per split (dev and test)")
    ap.add_argument("--pool", type=int, default=4000, help="questions searched for hard negatives")
    ap.add_argument("--answers", type=int, default=10, help="answers per set (N)")
    ap.add_argument("--p-sentence", type=float, default=0.3, help="share of sentence-form answers")
    ap.add_argument("--neighbours", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="small smoke run")
    args = ap.parse_args()
    if args.quick:
        args.questions, args.pool = 40, 400

    t0 = time.perf_counter()
    pool = load_questions(args.data, args.pool, args.seed)
    if len(pool) < 2 * args.questions:
        raise SystemExit(f"only {len(pool)} usable questions for 2 x {args.questions}")
    embedder = SentenceEmbedder(batch_size=128)
    q_emb = embedder.embed([p["question"] for p in pool])
    sims = q_emb @ q_emb.T
    np.fill_diagonal(sims, -np.inf)
    neighbours = np.argsort(-sims, axis=1)[:, : args.neighbours]
    splits = {
        "dev": build_sets(
            pool, list(range(args.questions)), neighbours, args.answers, args.p_sentence, args.seed
        ),
        "test": build_sets(
            pool,
            list(range(args.questions, 2 * args.questions)),
            neighbours,
            args.answers,
            args.p_sentence,
            args.seed + 1,
        ),
    }
    thresholds = [round(x, 2) for x in np.arange(0.30, 0.995, 0.01)]
    results: dict = {"config": {k: str(v) for k, v in vars(args).items()}, "splits": {}}
    exact = ExactClusterer()
    for split, sets in splits.items():
        qs = [s["question"] for s in sets]
        ans = [s["answers"] for s in sets]
        exact_ids = exact.cluster_many(qs, ans)
        rows = {"exact": evaluate(exact_ids, sets, exact_ids)}
        for include_q in (True, False):
            variant = "with_question" if include_q else "answer_only"
            rows[variant] = {}
            for th in thresholds:
                clusterer = EmbeddingClusterer(
                    threshold=th, include_question=include_q, embedder=embedder
                )
                rows[variant][str(th)] = evaluate(clusterer.cluster_many(qs, ans), sets, exact_ids)
        results["splits"][split] = rows
        results.setdefault("true_mean_clusters", {})[split] = float(
            np.mean([len(set(s["truth"])) for s in sets])
        )

    dev, test = results["splits"]["dev"], results["splits"]["test"]
    chosen = {}
    for variant in ("with_question", "answer_only"):
        best = max(thresholds, key=lambda th: dev[variant][str(th)]["ari_truth"])
        # One-standard-error rule, conservative side: the highest threshold whose dev ARI is within
        # one s.e. of the best. Merging different meanings hides uncertainty, so among thresholds
        # that the data cannot tell apart we take the one that merges least.
        floor = dev[variant][str(best)]["ari_truth"] - dev[variant][str(best)]["ari_truth_se"]
        pick = max(th for th in thresholds if dev[variant][str(th)]["ari_truth"] >= floor)
        chosen[variant] = {
            "threshold": pick,
            "best_dev_threshold": best,
            "dev": dev[variant][str(pick)],
            "test": test[variant][str(pick)],
            "test_at_best_dev_threshold": test[variant][str(best)],
        }
    results["chosen"] = chosen
    results["exact"] = {"dev": dev["exact"], "test": test["exact"]}
    results["seconds"] = time.perf_counter() - t0
    results["example_sets"] = splits["dev"][:3]

    cols = ("ari_truth", "ari_exact", "pair_precision", "pair_recall", "dse_abs_error")
    header = f"{'variant':>14} {'thr':>5} " + " ".join(f"{c:>14}" for c in cols)
    print(
        f"dev split, {args.questions} sets of N={args.answers}; ground-truth clusters/set:",
        f"{results['true_mean_clusters']['dev']:.2f}",
    )
    print(header)
    print(f"{'exact':>14} {'-':>5} " + " ".join(f"{dev['exact'][c]:>14.3f}" for c in cols))
    for variant in ("with_question", "answer_only"):
        for th in thresholds:
            marks = {
                chosen[variant]["threshold"]: " * chosen",
                chosen[variant]["best_dev_threshold"]: " + best",
            }
            if round(th * 100) % 5 == 0 or th in marks:
                r = dev[variant][str(th)]
                mark = marks.get(th, "")
                print(
                    f"{variant:>14} {th:>5.2f} " + " ".join(f"{r[c]:>14.3f}" for c in cols) + mark
                )
    print("\n(* chosen: highest threshold within one s.e. of the best dev ARI; + best dev ARI)")
    print("test split at the dev-chosen thresholds (mean ARI +- s.e.):")
    print(f"  exact: ARI {test['exact']['ari_truth']:.3f} +- {test['exact']['ari_truth_se']:.3f}")
    for variant, c in chosen.items():
        t = c["test"]
        print(
            f"  {variant} @ {c['threshold']:.2f}: "
            f"ARI {t['ari_truth']:.3f} +- {t['ari_truth_se']:.3f},"
            f" precision {t['pair_precision']:.3f}, recall {t['pair_recall']:.3f},"
            f" |D-SE error| {t['dse_abs_error']:.3f}"
        )
    args.output.parent.mkdir(parents=True, exist_ok=True)
    args.output.write_text(json.dumps(results, indent=2))
    print(f"\nwrote {args.output} ({results['seconds']:.0f} s)")


if __name__ == "__main__":
    main()
