"""The web page outlines the least certain sentence of an answer (headless Chromium, stand-in model)."""

from __future__ import annotations

import pytest
from serve_helpers import ScriptedModel, ask_on_page, chromium

from gnll.backends.base import Generation
from gnll.serving import ServeSettings, build_inprocess_app
from gnll.serving.server import ServerThread

pytestmark = pytest.mark.browser


TOKENS = ["It", " is", " Paris", ".", " Or", " maybe", " Lyon", "?"]
LOGPROBS = [-0.1, -0.1, -0.2, -0.1, -2.0, -1.0, -3.0, -1.0]


class TwoSentences(ScriptedModel):
    def generate(self, prompts, config=None, **kwargs):
        return [
            [Generation("".join(TOKENS), list(range(8)), TOKENS, LOGPROBS, "eos")] for _ in prompts
        ]


def test_least_certain_sentence_is_outlined():
    with (
        ServerThread(build_inprocess_app(TwoSentences(), ServeSettings(), max_wait_ms=5)) as srv,
        chromium() as browser,
    ):
        page = browser.new_page()
        page.goto(srv.url + "/")
        ask_on_page(page, "Where?")
        outlined = page.locator("#answer .tok.least").all_inner_texts()
        note = page.locator("#least-span").inner_text()
    assert outlined == [" Or", " maybe", " Lyon", "?"]
    assert "Least certain sentence: “Or maybe Lyon?”" in note and "7.0000" in note
