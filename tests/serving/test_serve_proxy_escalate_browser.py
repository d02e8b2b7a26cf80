"""The web page of `gnll serve --upstream SMALL --policy escalate --escalate-to LARGE` says where the
proxy's exact early decision was made, under the larger model's answer (headless Chromium, as
tests/serving/test_serve_browser.py drives it; the two upstreams are the stand-ins of
tests/escalate_standins.py)."""

from __future__ import annotations

import pytest
from escalate_standins import LargeUpstream, SmallUpstream, cascade
from serve_helpers import ask_on_page, chromium

pytestmark = pytest.mark.browser


def test_page_shows_where_the_proxy_decided_who_answered_and_the_larger_models_answer():
    with (
        SmallUpstream(tokens=40, pause=0.02) as small,
        LargeUpstream() as large,
        cascade(small, large) as px,
        chromium() as b,
    ):
        page = b.new_page()
        page.goto(px.url + "/")
        ask_on_page(page, "What is the capital of France?")
        assert "Paris." in page.locator("#answer").inner_text()
        note = page.locator("#early")
        assert note.is_visible()
        text = note.inner_text()
        assert "decided at token 7 " in text and "never generated" in text
        # who answered, and that the local model's answer was escalated, not "no policy"
        assert page.locator("#decision").inner_text() == "escalated"
        assert text.startswith("the local model small decided at token 7 ")
        by = page.locator("#answered-by")
        assert by.is_visible()
        assert by.inner_text() == (
            "answered by large: the local model small was unsure (G-NLL 3.5000 or more)"
        )
        assert page.locator("#history tbody td").nth(2).inner_text() == "escalated"
    # cut at the decision, long before the 40 tokens (the exact token: test_serve_proxy_escalate.py)
    assert small.disconnected == [True] and small.sent[0] < 20
