"""A short soak of ``gnll serve``: 16 clients, mixed kinds, both modes (``bench/serve_soak.py``).

The bench runs the real embedded model for ten minutes per mode; here a tiny random checkpoint
answers for 20 seconds per mode, with the same checks: every response and chunk valid under the
``openai`` types, no error, every request answered once (client ids and the servers' access logs),
and the servers' memory bounded after warm-up.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench"


@pytest.mark.server
@pytest.mark.parametrize("mode", ["inprocess", "proxy"])
def test_sixteen_clients_mixed_kinds_nothing_lost_nothing_duplicated(tiny_llama, tmp_path, mode):
    sys.path.insert(0, str(BENCH))
    try:
        import serve_soak
    finally:
        sys.path.remove(str(BENCH))
    r = serve_soak.run_mode(mode, str(tiny_llama()), 20.0, 16, 8, tmp_path)
    assert r["errors"] == 0, r["error_examples"]
    assert r["requests"] >= 16 * 4, r["requests"]  # every client went round the four kinds
    assert all(r["latency"][k]["n"] > 0 for k in serve_soak.KINDS)
    assert r["duplicate_answer_ids"] == 0 and r["duplicate_request_ids"] == 0
    servers = ["upstream", "proxy"] if mode == "proxy" else ["upstream"]
    assert sorted(r["lost"]) == sorted(servers), r
    assert all(v == 0 for v in r["lost"].values()), r["lost"]
    assert serve_soak.passed(r)
    for name in servers:
        mem = r["memory"][name]
        # 20 s is too short for a slope to mean much; what it can catch is a leak per request
        assert mem["rss_end_mb"] < mem["rss_after_warmup_mb"] + 100, mem
