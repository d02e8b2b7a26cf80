"""What an evaluation asks: dataset loaders, row checks, prompts and the registered tasks.

Imports nothing from the other wings of :mod:`gnll.evaluation`.
"""
