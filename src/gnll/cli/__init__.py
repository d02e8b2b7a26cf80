"""Command-line interface (``gnll ...``)."""
