"""Every seed recipe of gnll, pinned to the numbers it gave before the recipes moved to one module.

Cached stages, resumed runs and the server backend's request seeds depend on these exact values: a
change here means old caches silently stop matching, so a failing test is a real regression.
"""

from __future__ import annotations

from gnll._util.seeds import derive_seed, request_seed, sample_seed, seed_from, stable_hash
from gnll.backends.base import GenerationConfig
from gnll.backends.openai.model import OpenAICompatModel


def test_sample_seeds_are_unchanged():
    assert sample_seed(0, [1, 2, 3], 0) == 180723455918978432
    assert sample_seed(None, "Capital of France?", 4) == 4387267039103263436
    assert sample_seed(7, "Q", 2) == 9158253895218039713


def test_evaluation_stage_seeds_and_cache_names_are_unchanged():
    assert derive_seed(0, "triviaqa_short", "eval", 1.0) == 904834902
    assert derive_seed(3, "svamp_short", "heldout", None) == 1601026825
    assert stable_hash({"b": 1, "a": [1, 2]}) == "3813f9409eb0"
    assert stable_hash(["x"], 16) == "cd65ea2c2ad99e94"


def test_split_fewshot_and_bootstrap_stratum_seeds_are_unchanged():
    # formerly evaluation/tasks.py:_seed_from and evaluation/metrics.py:_stratum_seed
    assert seed_from(0, "triviaqa", "fewshot") == 4287435965
    assert seed_from(5, "split") == 3252987054
    assert seed_from("fixed-eval-subset-v1", "svamp") == 634221587
    assert seed_from(0, "0|m|svamp_short") == 1208270633
    assert seed_from(12, "k") == 1921137166


def test_server_request_seeds_are_unchanged():
    assert request_seed(0, 0, "Capital?") == 1247721326
    assert request_seed(42, 3, "Q") == 2095338913
    # the backend sends exactly these (and none without a seed)
    assert OpenAICompatModel._seed(None, GenerationConfig(seed=42), "Q", 3) == 2095338913
    assert OpenAICompatModel._seed(None, GenerationConfig(seed=None), "Q", 3) is None
