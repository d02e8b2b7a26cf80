"""`StopRules.split` in linear time gives what decoding every prefix gave, on the real tokenizers.

The oracle is the former implementation (decode ``body[:k]`` for growing ``k``), kept verbatim in
:func:`reference_split`.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from gnll.backends.base import DEFAULT_STOP, Generation, GenerationConfig
from gnll.backends.hf.loading import load_tokenizer_json
from gnll.backends.hf.stopping import StopRules
from gnll.backends.registry import EMBEDDED_MODELS, embedded_model_dir

CUSTOM_STOP = ("\n", "Question:", "ris Q", "😀", "字\nQ", "€")

pytestmark = pytest.mark.model  # the embedded models' real tokenizers (their converted checkpoints)


def reference_split(rules, ids, raw, tempered, config) -> Generation:
    """The former ``StopRules.split``: decodes a growing prefix per token (quadratic)."""
    decode = rules.tokenizer.decode
    end = next((t + 1 for t, i in enumerate(ids) if i in rules.token_ids), len(ids))
    ids = ids[:end]
    eos_at = next((t for t, i in enumerate(ids) if i in rules.eos_ids), None)
    body = ids[:eos_at] if eos_at is not None else ids
    text = decode(body)
    hits = [(text.find(s), s) for s in config.stop if s in text]
    if hits:
        cut, stop_seq = min(hits)
        finish = "stop"
        k = 0
        while k < len(body) and len(decode(body[: k + 1])) <= cut:
            k += 1
        term_end = k + 1
        while term_end < len(body) and len(decode(body[:term_end])) < cut + len(stop_seq):
            term_end += 1
        term_end = min(term_end, len(body))
    elif eos_at is not None:
        cut, stop_seq, finish = len(text), None, "eos"
        k, term_end = eos_at, eos_at + 1
    else:
        cut, stop_seq, finish = len(text), None, "length"
        k, term_end = len(ids), len(ids)
    answer_ids, term_ids = ids[:k], ids[k:term_end]
    lp = [] if raw is None else raw[: len(ids)].tolist()
    token_lp, term_lp = lp[:k], lp[k:term_end]
    if config.include_terminator:
        token_lp = token_lp + term_lp
    sampling = None
    if config.strategy == "sample":
        n = k if k or not term_ids else 1  # an empty answer: its stop token, tempered
        sampling = (tempered[:n] if tempered is not None else raw[:n]).tolist()
    return Generation(
        text=text[:cut].strip(),
        token_ids=answer_ids,
        tokens=[decode([i]) for i in answer_ids],
        token_logprobs=token_lp,
        finish_reason=finish,
        stop_sequence=stop_seq,
        terminator_token_ids=term_ids,
        terminator_logprobs=term_lp,
        sampling_logprobs=sampling,
    )


@pytest.fixture(scope="module", params=["smollm2-135m-instruct", "gemma-3-270m"])
def tokenizer(request):
    """The embedded models' own tokenizers (byte-level BPE; SentencePiece with byte fallback)."""
    return load_tokenizer_json(embedded_model_dir(EMBEDDED_MODELS[request.param]))


_RULES: dict[tuple[int, tuple[str, ...]], StopRules] = {}


def rules_for(tok, stop=DEFAULT_STOP) -> StopRules:
    """One :class:`StopRules` per tokenizer and stop strings (building one hashes the vocabulary)."""
    key = (id(tok), tuple(stop))
    if key not in _RULES:
        _RULES[key] = StopRules(tok, stop, {tok.eos_token_id})
    return _RULES[key]


def logprobs(n: int, seed: int = 0) -> np.ndarray:
    return -np.random.default_rng(seed).uniform(0.01, 5.0, size=n)


def ids_of(tok, *pieces: str) -> list[int]:
    return [i for p in pieces for i in tok(p, add_special_tokens=False)["input_ids"]]


def both(tok, ids, config=None, stop=None) -> Generation:
    """The new split, checked against the oracle on the same input."""
    config = config or GenerationConfig.greedy()
    rules = rules_for(tok, stop or config.stop)
    raw, tempered = logprobs(len(ids)), logprobs(len(ids), 1)
    new = rules.split(list(ids), raw, tempered, config)
    assert new == reference_split(rules, list(ids), raw, tempered, config)
    return new


def test_multi_token_stop_string(tokenizer):
    ids = ids_of(tokenizer, " Paris Question: Who")
    g = both(tokenizer, ids)
    assert (g.text, g.finish_reason, g.stop_sequence) == ("Paris", "stop", "Question:")
    assert tokenizer.decode(g.token_ids) == " Paris"
    assert tokenizer.decode(g.terminator_token_ids).startswith(" Question")
    assert len(g.token_logprobs) == len(g.token_ids) == len(g.tokens)


def test_stop_string_over_three_tokens_without_a_space(tokenizer):
    # "Question:" glued to the answer: the stop starts exactly at a token boundary.
    ids = ids_of(tokenizer, " Paris", "Qu", "estion", ":")
    g = both(tokenizer, ids)
    assert g.text == "Paris" and g.token_ids == ids_of(tokenizer, " Paris")
    assert tokenizer.decode(g.terminator_token_ids) == "Question:"


def test_stop_string_starting_inside_a_token(tokenizer):
    # "ris Q" starts inside the token " Paris": that token cannot be an answer token, so the
    # answer has no tokens and the terminator holds the stop's tokens; the text keeps "Pa".
    config = GenerationConfig.greedy(stop=CUSTOM_STOP)
    ids = ids_of(tokenizer, " Paris", " Question")
    g = both(tokenizer, ids, config)
    assert (g.text, g.stop_sequence, g.token_ids) == ("Pa", "ris Q", [])
    assert g.terminator_token_ids == ids


def test_partial_utf8_tokens_before_a_stop(tokenizer):
    # An emoji (several byte tokens in byte-level BPE) then a newline, a stop token.
    ids = ids_of(tokenizer, " yes😀\n")
    g = both(tokenizer, ids)
    assert (g.text, g.finish_reason, g.stop_sequence) == ("yes😀", "stop", "\n")
    assert tokenizer.decode(g.token_ids) == " yes😀"
    # A character cut in the middle of its bytes, then a stop string.
    emoji = ids_of(tokenizer, "😀")
    truncated = ids_of(tokenizer, " ok") + emoji[:-1] + ids_of(tokenizer, " Question:")
    both(tokenizer, truncated)


def byte_ids(tok) -> list[int]:
    """The token of each byte value: ``<0xNN>`` (byte fallback) or byte-level BPE's alphabet."""
    fallback = tok.convert_tokens_to_ids([f"<0x{b:02X}>" for b in range(256)])
    if tok.unk_token_id not in fallback and None not in fallback:
        return fallback
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    return tok.convert_tokens_to_ids(list(bytes_to_unicode().values()))


def test_byte_token_runs(tokenizer):
    """Characters spelled byte by byte, complete or cut, next to each other and to ASCII bytes
    (byte fallback decodes a run as a whole: one invalid byte spoils all of it)."""
    byte = byte_ids(tokenizer)
    euro = [byte[b] for b in "€".encode()]
    for middle in (euro, euro + euro[:2], euro[:2], euro + [byte[0x41]] + euro[:1]):
        ids = ids_of(tokenizer, " cost") + middle + ids_of(tokenizer, "\nQuestion: x")
        g = both(tokenizer, ids, GenerationConfig.greedy(stop=CUSTOM_STOP))
        assert g.finish_reason == "stop"


def test_no_stop_and_eos(tokenizer):
    ids = ids_of(tokenizer, " Paris is the capital of France")
    g = both(tokenizer, ids)
    assert (g.finish_reason, g.token_ids, g.terminator_token_ids) == ("length", ids, [])
    eos = tokenizer.eos_token_id
    g = both(tokenizer, [*ids, eos, *ids])
    assert (g.finish_reason, g.token_ids, g.terminator_token_ids) == ("eos", ids, [eos])
    assert g.text == "Paris is the capital of France"


FRAGMENTS = [
    " Paris", " the", " answer", " is", " 42", "\n", "Question:", "Question", ":", " Context:",
    "Con", "text", "Qu", "estion", "é", "😀", "漢字", " 𓀀", "€", "  ", ".", "Q", "ris", " Q",
    " naïve", "字", "\n\n", " Answer:",
]  # fmt: skip


def random_ids(tok, rng: np.random.Generator) -> list[int]:
    """Text-like ids, random vocabulary ids, byte tokens, cut characters and EOS, mixed."""
    n_vocab, byte = len(tok), byte_ids(tok)
    ids: list[int] = []
    for _ in range(rng.integers(1, 40)):
        r = rng.random()
        if r < 0.6:
            ids += ids_of(tok, str(rng.choice(FRAGMENTS)))
        elif r < 0.75:
            ids.append(int(rng.integers(0, n_vocab)))
        elif r < 0.85:
            char = str(rng.choice(["€", "😀", "é", "字", "A"])).encode()
            ids += [byte[b] for b in char][: rng.integers(1, len(char) + 1)]
        elif r < 0.95:
            piece = ids_of(tok, str(rng.choice(["😀", "漢字", " 𓀀", "€é"])))
            ids += piece[: rng.integers(1, len(piece) + 1)]
        else:
            ids.append(tok.eos_token_id)
    return ids


def test_linear_split_equals_the_prefix_decoding_oracle(tokenizer):
    rng = np.random.default_rng(0)
    configs = [
        GenerationConfig.greedy(),
        GenerationConfig.greedy(stop=CUSTOM_STOP, include_terminator=True),
        GenerationConfig.sample(2, temperature=0.7, stop=CUSTOM_STOP),
    ]
    rules = {c.stop: rules_for(tokenizer, c.stop) for c in configs}
    hits = 0
    for trial in range(600):
        ids = random_ids(tokenizer, rng)
        config = configs[trial % len(configs)]
        stops = rules[config.stop]
        raw, tempered = logprobs(len(ids), trial), logprobs(len(ids), trial + 1)
        new = stops.split(ids, raw, tempered, config)
        assert new == reference_split(stops, ids, raw, tempered, config), ids
        hits += new.finish_reason == "stop"
        # The lengths themselves, every prefix, also past the first stop.
        expect = [len(tokenizer.decode(ids[:j])) for j in range(len(ids) + 1)]
        assert stops.prefix_lengths(ids) == expect, ids
    assert hits > 200  # the tricky path (cutting at a stop) is what most trials exercise


def test_tokenizers_that_clean_up_spaces_decode_every_prefix(tokenizer):
    # Clean-up (" ." -> ".", " n't" -> "n't") reaches across tokens: no anchors then.
    tok = copy.copy(tokenizer)
    tok.clean_up_tokenization_spaces = True
    # transformers 5 ignores clean-up for BPE models unless forced
    tok.clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output = True
    ids = ids_of(tok, " I do", " n't", " know", " .", " Question", ":")
    expect = [len(tok.decode(ids[:j])) for j in range(len(ids) + 1)]
    assert expect != [len(tokenizer.decode(ids[:j])) for j in range(len(ids) + 1)]
    assert StopRules(tok, DEFAULT_STOP, {tok.eos_token_id}).prefix_lengths(ids) == expect


@pytest.mark.model
def test_split_of_real_sampled_answers_equals_the_oracle(smollm):
    """Hot samples of the real model (odd tokens, scripts, emoji), cut as generate() cuts them."""
    prompts = ["Write a poem in Japanese about the sea.", "List three emoji and a French word."]
    for stop in (DEFAULT_STOP, CUSTOM_STOP):
        config = GenerationConfig.sample(6, temperature=1.6, max_new_tokens=40, stop=stop, seed=2)
        rules = smollm.stop_rules(config.stop)
        for gens in smollm.generate(prompts, config):
            for g in gens:
                ids = g.token_ids + g.terminator_token_ids
                raw = logprobs(len(ids))
                new = rules.split(ids, raw, raw, config)
                assert new == reference_split(rules, ids, raw, raw, config), ids
                assert new.token_ids == g.token_ids and new.text == g.text
