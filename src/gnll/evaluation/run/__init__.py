"""How an evaluation runs: its configuration, the cached stages, the run directory and the runner.

Stands on :mod:`gnll.evaluation.data` (what to ask) and :mod:`gnll.evaluation.results` (what to
write at the end).
"""
