"""One definition per small concept: every layer applies the same rule (issue: duplicated concepts).

Each test feeds the same input to every place that used to have its own copy of the rule and checks
that they now agree.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from gnll import measures as M
from gnll._util import jsonable
from gnll.backends.base import ScoredAnswer
from gnll.backends.openai.client import ServerError
from gnll.backends.openai.parse import server_logprobs
from gnll.policy import AbstentionPolicy, uncertainty_record
from gnll.scoring.api import ScoringError, check_scored


def _scored(lps):
    return ScoredAnswer("a", list(range(len(lps))), ["t"] * len(lps), list(lps))


def _every_layer(lps):
    """G-NLL of ``lps`` as measures, scoring, serving and the server backend see it."""
    return [
        M.g_nll(lps),
        -sum(check_scored(_scored(lps), "a").token_logprobs),
        uncertainty_record(lps, decoding="greedy", policy=AbstentionPolicy()).g_nll,
        -sum(server_logprobs(list(lps), ["t"] * len(lps), "prompt 0")),
    ]


def test_round_off_above_zero_passes_every_layer_and_counts_as_zero():
    # +5e-6 used to pass measures (tolerance 1e-5) and fail gnll score (1e-6)
    assert _every_layer([-0.5, 5e-6]) == [pytest.approx(0.5)] * 4
    assert _every_layer([-0.5, 9e-5]) == [pytest.approx(0.5)] * 4


@pytest.mark.parametrize("bad", [2e-4, 0.3, float("nan"), float("-inf"), -9999.0, -1e5])
def test_an_invalid_logprob_fails_every_layer(bad):
    lps = [-0.5, bad]
    with pytest.raises(M.LogprobError):
        M.g_nll(lps)
    with pytest.raises(ScoringError):
        check_scored(_scored(lps), "a")
    with pytest.raises(M.LogprobError):
        uncertainty_record(lps, decoding="greedy", policy=AbstentionPolicy())
    with pytest.raises(ServerError):
        server_logprobs(lps, ["t", "u"], "prompt 0")


def test_logprob_errors_name_the_place_the_token_and_the_rule():
    with pytest.raises(M.LogprobError) as err:
        M.check_logprobs([-0.1, None], where="prompt 3", tokens=["a", "b"])
    assert err.value.kind == "missing" and "prompt 3: token 1 'b' has no log-prob" in str(err.value)
    with pytest.raises(ServerError, match="check the server's logprobs mode"):
        server_logprobs([-9999.0], ["x"], "prompt 3")


def test_one_json_converter_reads_back_like_json():
    obj = {"a": (1, 2.5, float("nan")), 2: {"t": True, "n": None}, "x": object}
    # what the fingerprint check compared before: a JSON round trip (NaN != NaN, so compare text)
    assert json.dumps(jsonable(obj, nan="keep")) == json.dumps(
        json.loads(json.dumps(obj, default=str))
    )
    assert jsonable({True: np.float32(0.5), None: np.arange(2)}) == {"true": 0.5, "null": [0, 1]}
    assert jsonable({"v": [math.inf, np.float64("nan")]}, nan="none") == {"v": [None, None]}


def test_scores_and_labels_are_checked_alike_everywhere():
    from gnll.calibration import Calibrator
    from gnll.calibration.metrics import probability_metrics
    from gnll.calibration.thresholds import accuracy_threshold
    from gnll.evaluation.results.metrics import auroc

    scores, labels = [0.1, float("nan"), 0.3, 0.4], [1, 0, 1, 0]
    calls = [
        lambda: auroc(labels, scores),
        lambda: Calibrator().fit(scores, labels),
        lambda: accuracy_threshold(scores, labels, target=0.8),
        lambda: probability_metrics(np.array(scores), np.array(labels)),
    ]
    for call in calls:
        with pytest.raises(ValueError, match="contain NaN or inf"):
            call()
    with pytest.raises(ValueError, match="equal length"):
        auroc([1, 0], [0.1])
    with pytest.raises(ValueError, match="0/1"):
        Calibrator().fit([0.1, 0.2, 0.3, 0.4], [1, 2, 0, 1])


def test_auto_clusterer_resolves_in_one_place(monkeypatch):
    import gnll.semantic as S
    from gnll.cli._args import clusterer_kwargs

    monkeypatch.setattr(S, "local_nli_model_available", lambda model=None: False)
    assert S.resolve_clusterer_name("auto") == S.resolve_clusterer_name("default") == "embedding"
    # the CLI types --clusterer_args for the clusterer 'auto' stands for (embedding: a threshold)
    assert clusterer_kwargs("auto", "threshold=0.9") == {"threshold": 0.9}
    monkeypatch.setattr(S, "local_nli_model_available", lambda model=None: True)
    assert S.resolve_clusterer_name("auto") == "nli"


def test_file_and_dataset_formats_have_distinct_names(tmp_path):
    from gnll._util.tabular import file_format
    from gnll.evaluation.data.datasets import detect_dataset

    assert file_format("rows.ndjson") == "jsonl" and file_format("x.bin", "parquet") == "parquet"
    with pytest.raises(ValueError, match="cannot tell the format"):
        file_format("rows.txt")
    p = tmp_path / "nq.jsonl"
    p.write_text('{"question": "q", "answer": ["a"]}\n')
    assert detect_dataset(p) == "nq_open"


def test_one_file_hash_for_data_files_and_checkpoints(tmp_path):
    import hashlib

    from gnll._util import file_sha256
    from gnll.backends import identity
    from gnll.evaluation.data import datasets

    p = tmp_path / "blob.bin"
    p.write_bytes(b"x" * (3 << 20) + b"tail")  # more than one read block
    assert file_sha256(p) == hashlib.sha256(p.read_bytes()).hexdigest()
    assert identity.file_sha256 is datasets.file_sha256 is file_sha256
