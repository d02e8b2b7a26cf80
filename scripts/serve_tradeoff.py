"""The accuracy/coverage trade-off an abstention threshold on G-NLL buys (docs/serving.md).

Reads labelled G-NLL scores (an eval run directory, or a scored file with ``g_nll`` and ``correct``
columns, e.g. the one ``scripts/calibrate_embedded.py`` writes) and prints, as a Markdown table, the
accuracy among answered questions when the server answers only the fraction of questions with the
lowest G-NLL, and what the rules of a calibration file do on the same data::

    python scripts/calibrate_embedded.py --limit 100          # writes runs/calibration/*.labelled.jsonl
    python scripts/serve_tradeoff.py runs/calibration/smollm2-135m-instruct.labelled.jsonl \\
        --calibration auto --model smollm2-135m-instruct

With ``--calibration`` from the same data the rules' figures are in-sample (their guarantees are
about new questions from the same distribution).
"""

from __future__ import annotations

import argparse

import numpy as np

from gnll.calibration import load_calibration, load_labelled


def tradeoff(scores: np.ndarray, labels: np.ndarray, coverages: list[float]) -> list[dict]:
    """Accuracy among the answered when answering the ``coverage`` fraction with the lowest G-NLL."""
    order = np.argsort(scores, kind="stable")
    rows = []
    for c in coverages:
        k = max(1, int(round(c * len(scores))))
        kept = order[:k]
        rows.append(
            {
                "answer when G-NLL <=": f"{scores[kept].max():.3f}",
                "coverage": f"{k / len(scores):.0%}",
                "answered": k,
                "accuracy among answered": f"{labels[kept].mean():.3f}",
            }
        )
    return rows


def table(rows: list[dict]) -> str:
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("paths", nargs="+", help="eval run directories or scored files")
    ap.add_argument("--calibration", default=None, help="a calibration file, or 'auto'")
    ap.add_argument("--model", default=None, help="the model (for --calibration auto)")
    args = ap.parse_args()
    data = load_labelled(args.paths, measure="g-nll")
    s, y = np.asarray(data.scores, float), np.asarray(data.labels, float)
    print(f"{len(s)} labelled answers, accuracy {y.mean():.3f} when answering everything\n")
    print(table(tradeoff(s, y, [1.0, 0.8, 0.6, 0.4, 0.2, 0.1])))
    if args.calibration:
        cal = load_calibration(args.calibration, model=args.model)
        rows = []
        for rule, t in cal.thresholds_.items():
            answered = np.isfinite(s) & (s <= t.threshold)
            rows.append(
                {
                    "rule": f"{rule} >= {t.target:g} (1 - delta = {1 - t.delta:g})",
                    "answer when G-NLL <=": f"{t.threshold:.3f}",
                    "coverage": f"{answered.mean():.0%}",
                    "accuracy among answered": f"{y[answered].mean():.3f}"
                    if answered.any()
                    else "-",
                }
            )
        print("\nThe calibration file's rules on these answers:\n")
        print(table(rows))


if __name__ == "__main__":
    main()
