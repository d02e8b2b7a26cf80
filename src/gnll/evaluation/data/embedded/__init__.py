"""The evaluation sample shipped inside gnll: a few hundred questions of each benchmark, so the main
job and the tests run on a machine that has neither the full files nor a dataset hub.

Each ``<dataset>.jsonl`` holds, for the default split (``--seed 0``) of the full file, its few-shot
pool, its held-out pool and the first questions of its evaluation pool, with every original record
verbatim (licenses and attribution in ``ATTRIBUTION.md`` beside it).
``scripts/build_embedded_sample.py`` rebuilds the files byte for byte from the full files.

>>> SAMPLE_SIZES["triviaqa"]
400
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["EMBEDDED_DIR", "SAMPLE_SIZES", "SAMPLE_SEED", "SAMPLE_TASKS"]

EMBEDDED_DIR = Path(__file__).resolve().parent
#: Evaluation-pool questions kept per dataset (the few-shot and held-out pools are kept whole):
#: TriviaQA's 400 are the demo's (``scripts/demo.sh``), so the demo asks the same questions here as on
#: the full file.
SAMPLE_SIZES = {"triviaqa": 400, "svamp": 200, "nq_open": 200}
#: The split the sample reproduces; another ``--seed`` re-splits the sample itself.
SAMPLE_SEED = 0
#: The task whose split cut each sample (short and long tasks of a dataset share their split).
SAMPLE_TASKS = {"triviaqa": "triviaqa_short", "svamp": "svamp_short", "nq_open": "nq_open_short"}
