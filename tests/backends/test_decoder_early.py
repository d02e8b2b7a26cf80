"""The decoding loop's ``watch`` hook (exact early decisions): a row ends at the token its watch
says, and its slot goes at once to a waiting prompt (continuous batching)."""

from __future__ import annotations

import pytest

from gnll import GenerationConfig

pytestmark = pytest.mark.model

TEXTS = ["Tell me a long story about a dragon.", "What is the capital of France?"]


def test_watched_row_stops_and_frees_its_slot_for_the_waiting_prompt(smollm):
    cfg = GenerationConfig.greedy(max_new_tokens=40, stop=())
    enc = smollm.encode(TEXTS)
    alone = smollm.open_decoder(cfg, width=1)
    alone.add(1, enc[1])
    ref = {}
    while alone.busy:
        ref.update(alone.step())
    heard = []

    def watch(j, token, lp):
        heard.append(token)
        return len(heard) == 3  # "decided" at the third token

    dec = smollm.open_decoder(cfg, width=1)  # one slot: the second prompt waits for it
    dec.add(0, enc[0], watch=watch)
    dec.add(1, enc[1])
    got, steps, admitted_at = {}, 0, None
    while dec.busy:
        got.update(dec.step())
        steps += 1
        live = [r.prompt.tag for r in dec.slots.rows if r is not None]
        if admitted_at is None and 1 in live:
            admitted_at = steps
    [stopped] = got[0]
    assert len(heard) == 3 and len(stopped.token_ids) == 3  # nothing generated after the decision
    # The waiting prompt takes the slot at the next step and decodes its first token there.
    assert admitted_at == 4
    assert got[1][0].token_ids == ref[1][0].token_ids  # and decoded as it does alone
    assert steps == 3 + len(ref[1][0].token_ids) + len(ref[1][0].terminator_token_ids)
