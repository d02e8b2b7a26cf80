"""The files of a run directory are named in one place: ``gnll._util.runfiles.RunDir``."""

from __future__ import annotations

import re
from pathlib import Path

from gnll._util.runfiles import RunDir

SRC = Path(__file__).resolve().parents[2] / "src" / "gnll"


def test_only_rundir_spells_the_run_files():
    literal = re.compile(r"""["'](samples\.jsonl|results\.json|run\.json)["']""")
    hits = [
        f"{p.relative_to(SRC)}:{i}"
        for p in sorted(SRC.rglob("*.py"))
        for i, line in enumerate(p.read_text().splitlines(), 1)
        if literal.search(line)
    ]
    assert hits and all(h.startswith("_util/runfiles.py:") for h in hits), hits


def test_rundir_names_what_the_writer_the_lock_and_the_cleaner_use():
    from gnll.evaluation.run.rundir import OWN_FILES, written_by_gnll
    from gnll.evaluation.run.store import OUTPUT_ENTRIES

    run = RunDir("r")
    assert OUTPUT_ENTRIES == RunDir.ENTRIES and RunDir.own_files() == OWN_FILES
    for path in (run.run_json, run.components, run.samples, run.results, run.table, run.timings):
        assert path.parent == run.path and path.name in RunDir.ENTRIES
        assert written_by_gnll(path.name)
