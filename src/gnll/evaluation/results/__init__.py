"""What an evaluation reports: correctness, AUROC and friends, ``results.json``, tables and plots.

Reads run files; imports nothing from :mod:`gnll.evaluation.run`, so a finished run can be
re-reported without the machinery that produced it.
"""
